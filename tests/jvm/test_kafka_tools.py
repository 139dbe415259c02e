"""Kafka's own command-line tools (what kafka-topics.sh, kafka-consumer-groups.sh, ... run) against kafscale, from
Apache Kafka 4.4.0's jars (tests/reference/lib/4.4.0): each test runs a tool, checks what it printed, and checks
what it did with another client (confluent-kafka) where the tool's own output would not show it.

Main classes, as found in 4.4.0's jars: org.apache.kafka.tools.{TopicCommand, ConfigCommand, AclCommand,
GetOffsetShell, LogDirsCommand, ConsoleProducer, ProducerPerformance, ConsumerPerformance, VerifiableProducer,
VerifiableConsumer},
org.apache.kafka.tools.consumer.ConsoleConsumer, org.apache.kafka.tools.consumer.group.ConsumerGroupCommand and
org.apache.kafka.tools.TransactionsCommand (kafka-transactions.sh).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from tests.integration.conftest import unique_topic, wait_until
from tests.jvm.conftest import JvmBroker
from tests.jvm.harness import Tools

pytestmark = pytest.mark.timeout(600)

TOOLS = "org.apache.kafka.tools"
TOPIC_COMMAND = f"{TOOLS}.TopicCommand"
CONFIG_COMMAND = f"{TOOLS}.ConfigCommand"
ACL_COMMAND = f"{TOOLS}.AclCommand"
GROUP_COMMAND = f"{TOOLS}.consumer.group.ConsumerGroupCommand"
GET_OFFSET_SHELL = f"{TOOLS}.GetOffsetShell"
LOG_DIRS_COMMAND = f"{TOOLS}.LogDirsCommand"
CONSOLE_PRODUCER = f"{TOOLS}.ConsoleProducer"
CONSOLE_CONSUMER = f"{TOOLS}.consumer.ConsoleConsumer"
PRODUCER_PERFORMANCE = f"{TOOLS}.ProducerPerformance"
CONSUMER_PERFORMANCE = f"{TOOLS}.ConsumerPerformance"
VERIFIABLE_PRODUCER = f"{TOOLS}.VerifiableProducer"
VERIFIABLE_CONSUMER = f"{TOOLS}.VerifiableConsumer"


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> Tools:
    return Tools(tmp_path_factory.mktemp("kafka-tools"))


@pytest.fixture
def admin(jvm_broker: JvmBroker) -> Iterator[AdminClient]:
    yield AdminClient(jvm_broker.plaintext())


def create(admin: AdminClient, topic: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
    admin.create_topics([NewTopic(topic, partitions, config=config or {})])[topic].result(30)


def produce(b: JvmBroker, topic: str, counts: dict[int, int]) -> None:
    producer = Producer(b.plaintext())
    for partition, n in counts.items():
        for i in range(n):
            producer.produce(topic, key=f"k{i}".encode(), value=f"p{partition}-{i}".encode(), partition=partition)
    assert producer.flush(30) == 0


def end_offsets(b: JvmBroker, topic: str, partitions: int) -> list[int]:
    consumer = Consumer({**b.plaintext(), "group.id": "end-offsets"})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(partitions)]
    finally:
        consumer.close()


def committed(b: JvmBroker, group: str, topic: str) -> int:
    consumer = Consumer({**b.plaintext(), "group.id": group})
    try:
        return int(consumer.committed([TopicPartition(topic, 0)], timeout=30)[0].offset)
    finally:
        consumer.close()


def properties_file(path: Path, settings: dict[str, Any]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in settings.items() if k != "bootstrap.servers"))
    return path


# ------------------------------------------------------------------------------------------------ TopicCommand


def test_topic_command_creates_lists_describes_alters_and_deletes(tools: Tools, jvm_broker: JvmBroker,
                                                                  admin: AdminClient) -> None:
    b, topic = jvm_broker.at("PLAINTEXT"), unique_topic("tool-topics")
    created = tools.run(TOPIC_COMMAND, "--bootstrap-server", b, "--create", "--topic", topic, "--partitions", "3",
                        "--config", "retention.ms=86400000").check()
    assert f"Created topic {topic}." in created.stdout
    assert topic in tools.run(TOPIC_COMMAND, "--bootstrap-server", b, "--list").check().stdout.split()
    described = tools.run(TOPIC_COMMAND, "--bootstrap-server", b, "--describe", "--topic", topic).check().stdout
    assert re.search(rf"Topic: {re.escape(topic)}\s+TopicId: \S+\s+PartitionCount: 3\s+ReplicationFactor: 1", described)
    assert "retention.ms=86400000" in described
    rows = re.findall(rf"Topic: {re.escape(topic)}\s+Partition: (\d+)\s+Leader: (\d+)", described)
    assert rows == [(str(p), str(jvm_broker.node_id)) for p in range(3)], described
    tools.run(TOPIC_COMMAND, "--bootstrap-server", b, "--alter", "--topic", topic, "--partitions", "5").check()
    assert len(admin.list_topics(topic, timeout=30).topics[topic].partitions) == 5
    tools.run(TOPIC_COMMAND, "--bootstrap-server", b, "--delete", "--topic", topic).check()
    wait_until(lambda: topic not in admin.list_topics(timeout=30).topics, what="the topic deleted")


# ------------------------------------------------------------------------------------- console producer, consumer


def test_console_producer_and_console_consumer(tools: Tools, jvm_broker: JvmBroker, admin: AdminClient) -> None:
    b, topic = jvm_broker.at("PLAINTEXT"), unique_topic("tool-console")
    create(admin, topic)
    lines = [f"key{i}:value {i}" for i in range(5)]
    tools.run(CONSOLE_PRODUCER, "--bootstrap-server", b, "--topic", topic, "--reader-property", "parse.key=true",
              "--reader-property", "key.separator=:", stdin="\n".join(lines) + "\n").check()
    assert end_offsets(jvm_broker, topic, 1) == [5]
    read = tools.run(CONSOLE_CONSUMER, "--bootstrap-server", b, "--topic", topic, "--from-beginning",
                     "--max-messages", "5", "--timeout-ms", "60000", "--formatter-property", "print.key=true",
                     "--formatter-property", "print.offset=true", "--formatter-property", "key.separator=|").check()
    assert read.stdout.splitlines() == [f"Offset:{i}|key{i}|value {i}" for i in range(5)], read.describe()
    assert "Processed a total of 5 messages" in read.stderr


# ------------------------------------------------------------------------------------------------ GetOffsetShell


def test_get_offset_shell(tools: Tools, jvm_broker: JvmBroker, admin: AdminClient) -> None:
    b, topic = jvm_broker.at("PLAINTEXT"), unique_topic("tool-offsets")
    create(admin, topic, partitions=2)
    produce(jvm_broker, topic, {0: 7, 1: 3})
    latest = tools.run(GET_OFFSET_SHELL, "--bootstrap-server", b, "--topic", topic, "--time", "-1").check()
    assert sorted(latest.stdout.split()) == [f"{topic}:0:7", f"{topic}:1:3"]
    earliest = tools.run(GET_OFFSET_SHELL, "--bootstrap-server", b, "--topic", topic, "--time", "-2").check()
    assert sorted(earliest.stdout.split()) == [f"{topic}:0:0", f"{topic}:1:0"]


# ------------------------------------------------------------------------------------------------ LogDirsCommand


def test_log_dirs_command_reports_each_partitions_size(tools: Tools, jvm_broker: JvmBroker,
                                                       admin: AdminClient) -> None:
    """kafka-log-dirs asks every broker (shard) for its log directories: each partition appears once, where it
    is led, with its size."""
    b, topic = jvm_broker.at("PLAINTEXT"), unique_topic("tool-log-dirs")
    create(admin, topic, partitions=2)
    produce(jvm_broker, topic, {0: 20})
    ran = tools.run(LOG_DIRS_COMMAND, "--bootstrap-server", b, "--describe", "--topic-list", topic).check()
    report = json.loads(ran.stdout.strip().splitlines()[-1])
    dirs = [d for broker in report["brokers"] for d in broker["logDirs"]]
    assert all(d["error"] is None and d["logDir"] for d in dirs), report
    sizes = {p["partition"]: p["size"] for d in dirs for p in d["partitions"]}
    assert sorted(sizes) == [f"{topic}-0", f"{topic}-1"], report
    assert sizes[f"{topic}-0"] > 20 * len(b"p0-19") and sizes[f"{topic}-1"] == 0, report


# ------------------------------------------------------------------------------------------- ConsumerGroupCommand


def test_consumer_group_command_describes_resets_and_deletes(tools: Tools, jvm_broker: JvmBroker,
                                                            admin: AdminClient) -> None:
    b, topic = jvm_broker.at("PLAINTEXT"), unique_topic("tool-groups")
    group = f"{topic}-group"
    create(admin, topic)
    produce(jvm_broker, topic, {0: 10})
    consumer = Consumer({**jvm_broker.plaintext(), "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    try:
        consumer.subscribe([topic])
        got = 0
        while got < 10:
            got += len(consumer.consume(10, timeout=1))
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()

    assert group in tools.run(GROUP_COMMAND, "--bootstrap-server", b, "--list").check().stdout.split()
    described = tools.run(GROUP_COMMAND, "--bootstrap-server", b, "--describe", "--group", group).check()
    # GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID
    row = next(line.split() for line in described.stdout.splitlines() if line.startswith(group))
    assert row[1:6] == [topic, "0", "10", "10", "0"], described.describe()
    assert f"Consumer group '{group}' has no active members." in described.stdout + described.stderr

    reset = tools.run(GROUP_COMMAND, "--bootstrap-server", b, "--reset-offsets", "--group", group, "--topic", topic,
                      "--to-offset", "4", "--execute").check()
    row = next(line.split() for line in reset.stdout.splitlines() if line.startswith(group))
    assert row[:4] == [group, topic, "0", "4"], reset.describe()
    assert committed(jvm_broker, group, topic) == 4

    deleted = tools.run(GROUP_COMMAND, "--bootstrap-server", b, "--delete", "--group", group).check()
    assert f"Deletion of requested consumer groups ('{group}') was successful." in deleted.stdout
    assert group not in {g.group_id for g in admin.list_consumer_groups().result(30).valid}


# ------------------------------------------------------------------------------------------------ ConfigCommand


def test_config_command_on_topics_and_brokers(tools: Tools, jvm_broker: JvmBroker, admin: AdminClient) -> None:
    b, topic = jvm_broker.at("PLAINTEXT"), unique_topic("tool-configs")
    create(admin, topic)
    altered = tools.run(CONFIG_COMMAND, "--bootstrap-server", b, "--entity-type", "topics", "--entity-name", topic,
                        "--alter", "--add-config", "retention.ms=12345,max.message.bytes=2000000").check()
    assert f"Completed updating config for topic {topic}." in altered.stdout
    described = tools.run(CONFIG_COMMAND, "--bootstrap-server", b, "--entity-type", "topics", "--entity-name", topic,
                          "--describe").check()
    assert f"Dynamic configs for topic {topic} are:" in described.stdout
    assert "retention.ms=12345 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=12345" in described.stdout
    assert "max.message.bytes=2000000" in described.stdout
    node = str(jvm_broker.node_id)
    broker = tools.run(CONFIG_COMMAND, "--bootstrap-server", b, "--entity-type", "brokers", "--entity-name", node,
                       "--describe", "--all").check()
    assert f"All configs for broker {node} are:" in broker.stdout
    assert len([line for line in broker.stdout.splitlines() if "=" in line and "sensitive=" in line]) > 0


def test_config_command_makes_a_scram_user_over_sasl_ssl(tools: Tools, jvm_broker: JvmBroker,
                                                         tmp_path: Path) -> None:
    b, user = jvm_broker.at("SASL_SSL"), f"erin-{unique_topic('u')[-8:]}"
    alice = properties_file(tmp_path / "alice.properties", jvm_broker.scram())
    altered = tools.run(CONFIG_COMMAND, "--bootstrap-server", b, "--command-config", str(alice), "--entity-type",
                        "users", "--entity-name", user, "--alter", "--add-config",
                        "SCRAM-SHA-512=[iterations=8192,password=erin-secret]").check()
    assert f"Completed updating config for user {user}." in altered.stdout
    described = tools.run(CONFIG_COMMAND, "--bootstrap-server", b, "--command-config", str(alice), "--entity-type",
                          "users", "--entity-name", user, "--describe").check()
    assert f"SCRAM credential configs for user-principal '{user}' are SCRAM-SHA-512=iterations=8192" in described.stdout
    # the new user logs in (the credential reaches the shard through the store's watch)
    settings = {"bootstrap.servers": b, "security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512",
                "sasl.username": user, "sasl.password": "erin-secret", "ssl.ca.location": str(jvm_broker.pki.ca_file)}

    def logs_in() -> bool:
        try:
            return bool(AdminClient(settings).list_topics(timeout=5).brokers)
        except Exception:
            return False

    wait_until(logs_in, what=f"{user} logging in")


# ------------------------------------------------------------------------------------------------ AclCommand


def test_acl_command_adds_lists_and_removes(tools: Tools, jvm_broker: JvmBroker, admin: AdminClient) -> None:
    b, topic = jvm_broker.at("PLAINTEXT"), unique_topic("tool-acls")
    principal = f"User:frank-{topic[-8:]}"
    grant = ["--allow-principal", principal, "--operation", "Read", "--operation", "Describe", "--topic", topic,
             "--group", f"{topic}-group"]
    tools.run(ACL_COMMAND, "--bootstrap-server", b, "--add", *grant).check()
    listed = tools.run(ACL_COMMAND, "--bootstrap-server", b, "--list", "--topic", topic).check().stdout
    assert f"Current ACLs for resource `ResourcePattern(resourceType=TOPIC, name={topic}, patternType=LITERAL)`" \
        in listed
    entries = set(re.findall(rf"\(principal={re.escape(principal)}, host=\*, operation=(\w+), permissionType=ALLOW\)",
                             listed))
    assert entries == {"READ", "DESCRIBE"}, listed
    found = admin.describe_acls(AclBindingFilter(ResourceType.GROUP, f"{topic}-group", ResourcePatternType.LITERAL,
                                                 principal, None, AclOperation.ANY, AclPermissionType.ANY)).result(30)
    assert sorted(a.operation.name for a in found) == ["DESCRIBE", "READ"]
    tools.run(ACL_COMMAND, "--bootstrap-server", b, "--remove", "--force", *grant).check()
    left = admin.describe_acls(AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, principal, None,
                                                AclOperation.ANY, AclPermissionType.ANY)).result(30)
    assert left == []


# ------------------------------------------------------------------------------------- ProducerPerformance, ...


def test_producer_performance_and_consumer_performance(tools: Tools, jvm_broker: JvmBroker,
                                                       admin: AdminClient) -> None:
    b, topic, n = jvm_broker.at("PLAINTEXT"), unique_topic("tool-perf"), 2000
    create(admin, topic, partitions=2)
    produced = tools.run(PRODUCER_PERFORMANCE, "--topic", topic, "--num-records", str(n), "--record-size", "100",
                         "--throughput", "-1", "--producer-props", f"bootstrap.servers={b}", "acks=all").check()
    summary = produced.stdout.strip().splitlines()[-1]
    assert summary.startswith(f"{n} records sent, "), produced.describe()
    assert sum(end_offsets(jvm_broker, topic, 2)) == n
    consumed = tools.run(CONSUMER_PERFORMANCE, "--bootstrap-server", b, "--topic", topic, "--num-records", str(n),
                         "--timeout", "60000").check()
    header, values = (line for line in consumed.stdout.strip().splitlines()[-2:])
    stats = dict(zip((h.strip() for h in header.split(",")), (v.strip() for v in values.split(",")), strict=False))
    assert int(stats["data.consumed.in.nMsg"]) == n, consumed.describe()
    assert float(stats["data.consumed.in.MB"]) == pytest.approx(n * 100 / 1024 / 1024, abs=0.01)


def events(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def test_verifiable_producer_and_verifiable_consumer(tools: Tools, jvm_broker: JvmBroker, admin: AdminClient) -> None:
    b, topic, n = jvm_broker.at("PLAINTEXT"), unique_topic("tool-verifiable"), 100
    create(admin, topic, partitions=2)
    produced = events(tools.run(VERIFIABLE_PRODUCER, "--bootstrap-server", b, "--topic", topic, "--max-messages",
                                str(n), "--acks", "-1").check().stdout)
    sent = [e for e in produced if e["name"] == "producer_send_success"]
    assert len(sent) == n and not [e for e in produced if e["name"] == "producer_send_error"]
    assert sorted(e["value"] for e in sent) == sorted(str(i) for i in range(n))
    stats = next(e for e in produced if e["name"] == "tool_data")
    assert (stats["sent"], stats["acked"]) == (n, n)
    offsets_by_partition: dict[int, list[int]] = {}
    for e in sent:
        offsets_by_partition.setdefault(e["partition"], []).append(e["offset"])
    assert all(sorted(o) == list(range(len(o))) for o in offsets_by_partition.values())

    group = f"{topic}-group"
    run = tools.run(VERIFIABLE_CONSUMER, "--bootstrap-server", b, "--topic", topic, "--group-id", group,
                    "--max-messages", str(n), "--reset-policy", "earliest").check()
    consumed = events(run.stdout)
    assert any(e["name"] == "partitions_assigned" and len(e["partitions"]) == 2 for e in consumed), run.describe()
    batches = [e for e in consumed if e["name"] == "records_consumed"]
    assert sum(e["count"] for e in batches) == n
    commits = [e for e in consumed if e["name"] == "offsets_committed"]
    assert commits and all(e["success"] for e in commits), commits
    final = {(o["topic"], o["partition"]): o["offset"] for e in commits for o in e["offsets"]}
    assert final == {(topic, p): len(o) for p, o in offsets_by_partition.items()}


# ------------------------------------------------------------------------------------------ TransactionsCommand

TRANSACTIONS_COMMAND = f"{TOOLS}.TransactionsCommand"


def write_hanging_transaction(b: JvmBroker, topic: str, partition: int) -> tuple[int, int]:
    """A transaction no coordinator knows, open in the partition: a transactional batch written straight into the
    partition's owner (what a client bug wrote into Kafka before KIP-890's checks, and what
    `kafka-transactions.sh find-hanging` looks for), from a fresh producer id, timestamped long ago. Returns
    (producer id, its first offset)."""
    from tests.differential.test_transactions import ROWS, txn_batch

    core = b.broker.shard.core  # type: ignore[union-attr]

    async def write() -> tuple[int, int]:
        producer_id = await core.allocate_producer_id()
        owner = await core.owner(topic, partition)
        outcome = owner.try_append(bytearray(txn_batch(producer_id, 0, 0, ROWS)), acks=-1)
        assert outcome is not None and outcome.durable is not None, outcome
        await outcome.durable
        return producer_id, outcome.base_offset

    return b.broker.run(write())


def read_committed(b: JvmBroker, topic: str, partition: int) -> list[bytes]:
    consumer = Consumer({**b.plaintext(), "group.id": unique_topic("rc"), "isolation.level": "read_committed",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, partition, 0)])
        values: list[bytes] = []
        for _ in range(20):
            values += [m.value() for m in consumer.consume(100, timeout=0.5) if m.error() is None]
        return values
    finally:
        consumer.close()


def test_transactions_command_lists_describes_finds_and_aborts_a_hanging_transaction(
        tools: Tools, jvm_broker: JvmBroker, admin: AdminClient) -> None:
    from tests.differential.test_transactions import ROWS, Txn
    from tests.differential.wire import Peer

    b, topic = jvm_broker.at("PLAINTEXT"), unique_topic("tool-txn")
    # kept forever: time retention (run every minute) would otherwise drop the hanging batch, timestamped long ago
    create(admin, topic, 2, {"retention.ms": "-1"})
    with Peer("kafscale", jvm_broker.port) as peer:
        # partition 0: a real transaction, left open (its coordinator knows it: it is not hanging)
        txn = Txn(peer, timeout_ms=600_000)  # outlives the tools' runs (a minute or more on a loaded machine)
        assert txn.add_partitions({topic: [0]}) == {f"{topic}:0": "NONE"}
        assert txn.produce(topic, 0, ROWS) == ("NONE", 0)
        # partition 1: a hanging transaction, then plain records after it
        hanging, first = write_hanging_transaction(jvm_broker, topic, 1)
        produce(jvm_broker, topic, {1: 2})

        def lso() -> int:
            return int(peer.list_offsets(topic, [(1, -1)], isolation_level=1)[1].offset)

        assert first == 0 and lso() == 0
        run = lambda *args: tools.run(TRANSACTIONS_COMMAND, "--bootstrap-server", b, *args).check().stdout  # noqa: E731

        listed = run("list")
        assert re.search(rf"^{re.escape(txn.id)}\s+{jvm_broker.node_id}\s+{txn.producer_id}\s+Ongoing\s*$", listed,
                         re.M), listed
        described = run("describe", "--transactional-id", txn.id)
        assert re.search(rf"\s{txn.producer_id}\s+{txn.epoch}\s+Ongoing\s+600000\s+\d+\s+\d+\s+{topic}-0\s*$",
                         described, re.M), described
        producers = run("describe-producers", "--topic", topic, "--partition", "1")
        # ProducerId ProducerEpoch LatestCoordinatorEpoch LastSequence LastTimestamp CurrentTransactionStartOffset
        assert re.search(rf"^{hanging}\s+0\s+-1\s+2\s+\d+\s+{first}\s*$", producers, re.M), producers
        found = run("find-hanging", "--broker-id", str(jvm_broker.node_id))
        assert re.search(rf"^{re.escape(topic)}\s+1\s+{hanging}\s+0\s+-1\s+{first}\s", found, re.M), found
        assert not re.search(rf"^{re.escape(topic)}\s+0\s", found, re.M), found  # the real one is not hanging

        assert read_committed(jvm_broker, topic, 1) == []  # stuck behind the hanging transaction
        run("abort", "--topic", topic, "--partition", "1", "--start-offset", str(first))
        wait_until(lambda: lso() == 6, what="the last stable offset past the abort marker (at 5)")
        assert read_committed(jvm_broker, topic, 1) == [b"p1-0", b"p1-1"]  # the aborted records are skipped
        assert not re.search(rf"^{re.escape(topic)}\s+1\s",
                             run("find-hanging", "--broker-id", str(jvm_broker.node_id)), re.M)
        assert txn.end(False) == "NONE"


def test_console_consumer_reads_what_the_broker_compressed(tools: Tools, jvm_broker: JvmBroker,
                                                           admin: AdminClient) -> None:
    """A topic's compression.type makes the broker compress what producers sent uncompressed: Kafka's Java client
    reads the broker's frames of every codec (lz4's in linked 64 KiB blocks, snappy's raw, as cramjam writes them)."""
    b, prefix = jvm_broker.at("PLAINTEXT"), unique_topic("tool-codec")
    producer = Producer({**jvm_broker.plaintext(), "compression.type": "none", "linger.ms": 200})
    for codec in ("lz4", "zstd", "snappy", "gzip"):
        create(admin, f"{prefix}-{codec}", config={"compression.type": codec})
        for i in range(300):  # one batch of about 160 KiB: several lz4 blocks
            producer.produce(f"{prefix}-{codec}", value=f"{codec} {i} ".encode() + b"0123456789abcdef" * 32)
    assert producer.flush(30) == 0
    read = tools.run(CONSOLE_CONSUMER, "--bootstrap-server", b, "--include", f"{prefix}-.*", "--from-beginning",
                     "--max-messages", "1200", "--timeout-ms", "60000").check()
    assert "Processed a total of 1200 messages" in read.stderr, read.describe()
    assert sorted(line.split()[0] for line in read.stdout.splitlines()) == sorted(
        [c for c in ("gzip", "lz4", "snappy", "zstd") for _ in range(300)])
