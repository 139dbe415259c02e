"""ACLs (`--authorizer acl`) with real clients: Kafka's ACL APIs manage them, every API checks them
(docs/security.md, "Authorization").

One SASL_PLAINTEXT broker, super user User:admin; alice and bob are ordinary users. Admin grants through
confluent-kafka's AdminClient (and `kafscale acl`), and alice and bob find out what they may do.
"""

from __future__ import annotations

import contextlib
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from kafscale.config import BrokerConfig
from kafscale.protocol import make, request_class
from kafscale.protocol.codec import nested
from kafscale.protocol.errors import ErrorCode
from kafscale.security import credentials
from kafscale.security.scram import Mechanism, ScramCredential
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.local_store import LocalDirStore
from kafscale.testing.inprocess import InProcessBroker
from tests.integration.test_security import call, raw, wait_for


@contextlib.contextmanager
def logged_in(broker: InProcessBroker, user: str) -> Iterator[socket.socket]:
    """A raw connection, authenticated with SASL/PLAIN: for answers clients hide."""
    with raw(broker.bootstrap_for("SASL_PLAINTEXT")) as s:
        assert call(s, 17, 1, mechanism="PLAIN").error_code == ErrorCode.none
        login = call(s, 36, 2, correlation_id=2, auth_bytes=f"\0{user}\0{USERS[user]}".encode())
        assert login.error_code == ErrorCode.none
        yield s

USERS = {"admin": "admin-pw", "alice": "alice-pw", "bob": "bob-pw"}


@contextlib.contextmanager
def acl_broker_in(d: Path) -> Iterator[InProcessBroker]:
    """SASL_PLAINTEXT with SCRAM, the ACL authorizer, super user User:admin; USERS' credentials in place."""
    config = BrokerConfig(listeners="SASL_PLAINTEXT://127.0.0.1:0", authorizer="acl", super_users="User:admin",
                          sasl_enabled_mechanisms="SCRAM-SHA-256,PLAIN", metrics_listen="", flush_interval_ms=20)
    b = InProcessBroker(config, meta=lambda: EmbeddedStore(d / "meta.db"), objects=lambda: LocalDirStore(d / "o"))
    with b:
        for user, password in USERS.items():
            b.run(credentials.upsert(b.shard.core.meta, user,  # type: ignore[union-attr]
                                     ScramCredential.from_password(Mechanism.SCRAM_SHA_256, password)))
        wait_for(lambda: all(b.shard.core.credentials.any_of(u) for u in USERS))  # type: ignore[union-attr]
        yield b


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    with acl_broker_in(tmp_path_factory.mktemp("acl-broker")) as b:
        yield b


def settings(broker: InProcessBroker, user: str) -> dict[str, Any]:
    return {"bootstrap.servers": broker.bootstrap_for("SASL_PLAINTEXT"), "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "SCRAM-SHA-256", "sasl.username": user, "sasl.password": USERS[user]}


def admin_of(broker: InProcessBroker, user: str) -> AdminClient:
    return AdminClient(settings(broker, user))


def grant(broker: InProcessBroker, *bindings: AclBinding) -> None:
    """Creates the bindings and waits until the broker's authorizer has them: they reach it through the store's
    watch, after CreateAcls is answered."""
    admin = admin_of(broker, "admin")  # held until the answers are in: a dropped client cancels its requests
    for future in admin.create_acls(list(bindings)).values():
        future.result(15)
    wanted = {(b.restype.value, b.name, b.resource_pattern_type.value, b.principal, b.host, b.operation.value,
               b.permission_type.value) for b in bindings}
    wait_for(lambda: wanted <= {(int(b.resource_type), b.name, int(b.pattern_type), b.principal, b.host,
                                 int(b.operation), int(b.permission))
                                for b in broker.shard.core.acls.bindings})  # type: ignore[union-attr]


def revoke(broker: InProcessBroker, *filters: AclBindingFilter) -> list[AclBinding]:
    admin = admin_of(broker, "admin")
    return [b for f in admin.delete_acls(list(filters)).values() for b in f.result(15)]


def allow(restype: ResourceType, name: str, op: AclOperation, user: str = "alice",
          pattern: ResourcePatternType = ResourcePatternType.LITERAL,
          permission: AclPermissionType = AclPermissionType.ALLOW) -> AclBinding:
    return AclBinding(restype, name, pattern, f"User:{user}", "*", op, permission)


def create_topic(broker: InProcessBroker, name: str, partitions: int = 1) -> None:
    admin = admin_of(broker, "admin")
    admin.create_topics([NewTopic(name, partitions)])[name].result(15)


def produce(broker: InProcessBroker, user: str, topic: str, n: int = 5) -> list[KafkaError | None]:
    producer = Producer({**settings(broker, user), "acks": "all", "enable.idempotence": False,
                         "message.timeout.ms": 5000})
    outcomes: list[KafkaError | None] = []
    for i in range(n):
        producer.produce(topic, value=f"v{i}".encode(), on_delivery=lambda err, _m: outcomes.append(err))
    producer.flush(15)
    return outcomes


def consume(broker: InProcessBroker, user: str, topic: str, group: str, n: int) -> tuple[list[bytes], list[int]]:
    """Values read and the error codes seen, within 15 s."""
    consumer = Consumer({**settings(broker, user), "group.id": group, "auto.offset.reset": "earliest"})
    got: list[bytes] = []
    errors: list[int] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 15
        while len(got) < n and time.monotonic() < deadline and not errors:
            m = consumer.poll(0.5)
            if m is None:
                continue
            if m.error():
                errors.append(m.error().code())
            else:
                got.append(m.value())
    finally:
        consumer.close()
    return got, errors


def name(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def test_acls_are_created_described_and_deleted_through_kafkas_api(broker: InProcessBroker) -> None:
    topic = name("desc-")
    grant(broker, allow(ResourceType.TOPIC, topic, AclOperation.READ),
          allow(ResourceType.TOPIC, topic, AclOperation.WRITE, permission=AclPermissionType.DENY, user="bob"))
    admin, alice = admin_of(broker, "admin"), admin_of(broker, "alice")
    found = admin.describe_acls(AclBindingFilter(
        ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, None, None, AclOperation.ANY,
        AclPermissionType.ANY)).result(15)
    assert sorted((b.principal, b.operation.name, b.permission_type.name) for b in found) == [
        ("User:alice", "READ", "ALLOW"), ("User:bob", "WRITE", "DENY")]
    gone = revoke(broker, AclBindingFilter(ResourceType.TOPIC, topic, ResourcePatternType.ANY, "User:bob", None,
                                           AclOperation.ANY, AclPermissionType.ANY))
    assert [b.principal for b in gone] == ["User:bob"]
    # Only a principal allowed to (here the super user) manages ACLs.
    with pytest.raises(KafkaException, match="CLUSTER_AUTHORIZATION_FAILED"):
        for future in alice.create_acls([allow(ResourceType.TOPIC, topic, AclOperation.ALL)]).values():
            future.result(15)
    # (librdkafka's describe_acls drops the error of the answer: asked on the wire.)
    with logged_in(broker, "alice") as s:
        answer = call(s, 29, 3, correlation_id=5, resource_type_filter=1, resource_name_filter=None,
                      pattern_type_filter=1, principal_filter=None, host_filter=None, operation=1, permission_type=1)
        assert answer.error_code == ErrorCode.cluster_authorization_failed and answer.resources == ()


def test_produce_and_consume_need_write_read_and_the_group(broker: InProcessBroker) -> None:
    topic, group = name("app-"), name("g-")
    create_topic(broker, topic)
    assert all(e is not None and e.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
               for e in produce(broker, "alice", topic))
    grant(broker, allow(ResourceType.TOPIC, "app-", AclOperation.WRITE, pattern=ResourcePatternType.PREFIXED),
          allow(ResourceType.TOPIC, "app-", AclOperation.READ, pattern=ResourcePatternType.PREFIXED))
    wait_for(lambda: produce(broker, "alice", topic, 1) == [None])
    assert produce(broker, "alice", topic, 4) == [None] * 4
    _, errors = consume(broker, "alice", topic, group, 5)  # the topic, not the group
    assert errors == [KafkaError.GROUP_AUTHORIZATION_FAILED]
    grant(broker, allow(ResourceType.GROUP, group, AclOperation.READ))
    got, errors = consume(broker, "alice", topic, group, 5)
    assert errors == [] and sorted(got) == sorted([b"v0"] + [f"v{i}".encode() for i in range(4)])
    # bob has nothing: he cannot write, and does not even see the topic.
    assert all(e is not None and e.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
               for e in produce(broker, "bob", topic, 1))
    bob, alice = admin_of(broker, "bob"), admin_of(broker, "alice")
    assert topic not in bob.list_topics(timeout=10).topics
    assert topic in alice.list_topics(timeout=10).topics
    # Each principal's list of every topic is kept until the ACLs change: a grant shows bob the topic.
    grant(broker, allow(ResourceType.TOPIC, topic, AclOperation.DESCRIBE, user="bob"))
    wait_for(lambda: topic in bob.list_topics(timeout=10).topics)
    assert topic in alice.list_topics(timeout=10).topics


def test_a_deny_overrides_an_allow(broker: InProcessBroker) -> None:
    topic = name("app-secret-")
    create_topic(broker, topic)
    grant(broker, allow(ResourceType.TOPIC, "app-", AclOperation.WRITE, pattern=ResourcePatternType.PREFIXED),
          allow(ResourceType.TOPIC, topic, AclOperation.WRITE, permission=AclPermissionType.DENY))
    assert all(e is not None and e.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
               for e in produce(broker, "alice", topic, 2))


def test_removing_an_acl_takes_effect_on_an_open_connection_within_a_second(broker: InProcessBroker) -> None:
    topic = name("live-")
    create_topic(broker, topic)
    grant(broker, allow(ResourceType.TOPIC, topic, AclOperation.WRITE))
    producer = Producer({**settings(broker, "alice"), "acks": "all", "enable.idempotence": False,
                         "message.timeout.ms": 5000, "retries": 0})
    outcomes: list[KafkaError | None] = []

    def send() -> KafkaError | None:
        outcomes.clear()
        producer.produce(topic, b"x", on_delivery=lambda err, _m: outcomes.append(err))
        producer.flush(10)
        return outcomes[0]

    wait_for(lambda: send() is None)  # the connection is open and allowed
    revoke(broker, AclBindingFilter(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:alice", None,
                                    AclOperation.WRITE, AclPermissionType.ALLOW))
    revoked = time.monotonic()
    while (err := send()) is None:
        assert time.monotonic() - revoked < 1.0, "still allowed a second after the ACL went"
        time.sleep(0.05)
    assert err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_admin_apis_check_create_alter_describe_configs_and_delete(broker: InProcessBroker) -> None:
    topic = name("adm-")
    alice = admin_of(broker, "alice")
    with pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED"):
        alice.create_topics([NewTopic(topic, 1)])[topic].result(15)
    grant(broker, allow(ResourceType.TOPIC, "adm-", AclOperation.CREATE, pattern=ResourcePatternType.PREFIXED))
    alice.create_topics([NewTopic(topic, 1)])[topic].result(15)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    with pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED"):
        alice.describe_configs([resource])[resource].result(15)
    with pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED"):
        alice.delete_topics([topic])[topic].result(15)
    grant(broker, allow(ResourceType.TOPIC, topic, AclOperation.ALTER_CONFIGS),
          allow(ResourceType.TOPIC, topic, AclOperation.DELETE))
    assert alice.describe_configs([resource])[resource].result(15)  # implied by ALTER_CONFIGS
    alice.delete_topics([topic])[topic].result(15)
    # The cluster's own resources: DescribeCluster needs DESCRIBE on it (librdkafka's describe_cluster asks
    # Metadata instead, which lists brokers to everyone, as Kafka's does), as do the SCRAM admin APIs.
    with logged_in(broker, "alice") as s:
        answer = call(s, 60, 0, correlation_id=5, include_cluster_authorized_operations=False)
        assert answer.error_code == ErrorCode.cluster_authorization_failed and answer.brokers == ()
        # On the wire: confluent-kafka 2.16 corrupts its heap ("munmap_chunk(): invalid pointer") on any
        # failed DescribeUserScramCredentials, shaped as Kafka shapes it.
        answer = call(s, 50, 0, correlation_id=6, users=None)
        assert answer.error_code == ErrorCode.cluster_authorization_failed
        answer = call(s, 35, 4, correlation_id=7, topics=None)  # DescribeLogDirs
        assert answer.error_code == ErrorCode.cluster_authorization_failed and answer.results == ()
    with logged_in(broker, "admin") as s:
        answer = call(s, 60, 0, correlation_id=5, include_cluster_authorized_operations=False)
        assert answer.error_code == ErrorCode.none and answer.brokers
        answer = call(s, 35, 4, correlation_id=7, topics=None)
        assert answer.error_code == ErrorCode.none and len(answer.results) == 1


def test_kafka_python_sees_the_authorization_errors(broker: InProcessBroker) -> None:
    from kafka import KafkaProducer
    from kafka.errors import TopicAuthorizationFailedError

    topic = name("kp-")
    create_topic(broker, topic)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_for("SASL_PLAINTEXT"),
                             security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256",
                             sasl_plain_username="bob", sasl_plain_password="bob-pw", max_block_ms=5000)
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            producer.send(topic, b"x").get(10)
    finally:
        producer.close()


def test_kafscale_acl_adds_lists_and_removes(broker: InProcessBroker, capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    from kafscale.cli import main

    as_admin = ["-b", broker.bootstrap_for("SASL_PLAINTEXT"),
                *[f"-X{k}={v}" for k, v in settings(broker, "admin").items() if k != "bootstrap.servers"]]
    group = name("cli-")
    assert main(["acl", "add", "--group", group, "--principal", "User:bob", "--operation", "read", *as_admin]) == 0
    assert f"ALLOW User:bob from * READ on group:{group} (LITERAL)" in capsys.readouterr().out
    assert main(["acl", "list", "--group", group, *as_admin]) == 0
    out = capsys.readouterr().out
    assert f"group:{group}" in out and "User:bob" in out
    assert main(["acl", "remove", "--group", group, "--principal", "User:bob", *as_admin]) == 0
    assert "removed: ALLOW User:bob" in capsys.readouterr().out
    assert main(["acl", "remove", "--group", group, *as_admin]) == 1
    assert "no ACL matches" in capsys.readouterr().err


def test_partition_offsets_of_a_topic_alice_may_not_describe_are_refused(broker: InProcessBroker) -> None:
    topic = name("hidden-")
    create_topic(broker, topic)
    with logged_in(broker, "alice") as s:
        answer = call(s, 2, 7, correlation_id=5, replica_id=-1, isolation_level=0, topics=(
            make(nested(request_class(2, 7), "ListOffsetsTopic"), name=topic, partitions=(
                make(nested(request_class(2, 7), "ListOffsetsPartition"), partition_index=0, current_leader_epoch=-1,
                     timestamp=-1),)),))
        assert answer.topics[0].partitions[0].error_code == ErrorCode.topic_authorization_failed
