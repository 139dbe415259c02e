"""Admin APIs through real admin clients (confluent-kafka, kafka-python) and the raw wire: topics,
configs (AlterConfigs and IncrementalAlterConfigs), partitions, DeleteRecords, DescribeCluster,
OffsetForLeaderEpoch; results and error codes as Apache Kafka gives them."""

from __future__ import annotations

import datetime
import sys

import pytest
from confluent_kafka import KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
)
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType as KpType
from kafka.admin import KafkaAdminClient
from kafka.admin import NewPartitions as KpNewPartitions
from kafka.admin import NewTopic as KpNewTopic
from kafka.structs import TopicPartition as KpTopicPartition

from kafscale.protocol import make, request_class
from kafscale.protocol.errors import ErrorCode
from tests.integration.conftest import METADATA, Cluster, build, unique_topic

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _admin(cluster: Cluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap})


def _produce(cluster: Cluster, topic: str, n: int, partition: int = 0) -> None:
    p = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 0})
    for i in range(n):
        p.produce(topic, value=f"v{i}".encode(), partition=partition)
        p.flush(10)  # one batch per record: several flush windows, offsets 0..n-1
    assert p.flush(10) == 0


def _topic_configs(admin: AdminClient, topic: str) -> dict[str, ConfigEntry]:
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return admin.describe_configs([res])[res].result(20)


def test_confluent_admin_lifecycle(broker_embedded: Cluster) -> None:
    admin = _admin(broker_embedded)
    topic = unique_topic("admin-ck")
    admin.create_topics([NewTopic(topic, 2, config={"retention.ms": "3600000"})])[topic].result(20)

    configs = _topic_configs(admin, topic)
    assert configs["retention.ms"].value == "3600000"
    assert configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["cleanup.policy"].value == "delete" and configs["cleanup.policy"].is_default

    # IncrementalAlterConfigs: SET one, DELETE another; untouched configs stay.
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.bytes", "1048576", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("max.message.bytes", "500000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(20)
    configs = _topic_configs(admin, topic)
    assert (configs["retention.ms"].value, configs["retention.bytes"].value) == ("3600000", "1048576")
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE)])
    admin.incremental_alter_configs([res])[res].result(20)
    configs = _topic_configs(admin, topic)
    assert configs["retention.ms"].value == "604800000" and configs["retention.ms"].is_default
    assert configs["max.message.bytes"].value == "500000"

    # Legacy AlterConfigs replaces the whole set: max.message.bytes reverts to its default.
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, set_config={"compression.type": "gzip"})
    admin.alter_configs([res])[res].result(20)
    configs = _topic_configs(admin, topic)
    assert configs["compression.type"].value == "gzip"
    assert configs["max.message.bytes"].is_default and configs["retention.bytes"].is_default

    # Unsupported config: INVALID_CONFIG with a message naming it.
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, set_config={"min.insync.replicas": "2"})
    with pytest.raises(KafkaException) as err:
        admin.alter_configs([res])[res].result(20)
    assert err.value.args[0].code() == ErrorCode.invalid_config and "min.insync.replicas" in err.value.args[0].str()

    # Partitions: additive; data already in partition 0 is untouched.
    _produce(broker_embedded, topic, 3)
    admin.create_partitions([NewPartitions(topic, 4)])[topic].result(20)
    assert len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == 4
    with pytest.raises(KafkaException) as err:
        admin.create_partitions([NewPartitions(topic, 3)])[topic].result(20)
    assert err.value.args[0].code() == ErrorCode.invalid_partitions
    with broker_embedded.wire() as wire:
        assert wire.end_offsets(topic, 4) == [3, 0, 0, 0]

    # DeleteRecords: the log start moves, fetches below it are out of range.
    deleted = admin.delete_records([TopicPartition(topic, 0, 2)])
    (_tp, fut), = deleted.items()
    assert fut.result(20).low_watermark == 2
    with broker_embedded.wire() as wire:
        assert wire.list_offset(topic, 0, -2).offset == 2
        assert wire.fetch(topic, 0, 1).error_code == ErrorCode.offset_out_of_range
        assert wire.fetch(topic, 0, 2).error_code == ErrorCode.none
    with pytest.raises(KafkaException) as err:
        admin.delete_records([TopicPartition(topic, 0, 99)])[TopicPartition(topic, 0, 99)].result(20)
    assert err.value.args[0].code() == ErrorCode.offset_out_of_range

    # Broker configs are there and read-only.
    res = ConfigResource(ConfigResource.Type.BROKER, "0")
    broker_configs = admin.describe_configs([res])[res].result(20)
    assert broker_configs["broker.id"].value == "0" and broker_configs["broker.id"].is_read_only
    assert broker_configs["kafscale.s3.secret.key"].is_sensitive
    res = ConfigResource(ConfigResource.Type.BROKER, "0", set_config={"log.retention.ms": "1"})
    with pytest.raises(KafkaException) as err:
        admin.alter_configs([res])[res].result(20)
    assert err.value.args[0].code() == ErrorCode.invalid_config

    admin.delete_topics([topic])[topic].result(20)
    assert topic not in admin.list_topics(timeout=10).topics


def test_kafka_python_admin_lifecycle(broker_embedded: Cluster) -> None:
    admin = KafkaAdminClient(bootstrap_servers=broker_embedded.bootstrap, request_timeout_ms=20000)
    topic = unique_topic("admin-kp")
    try:
        admin.create_topics([KpNewTopic(topic, 1, 1, topic_configs={"segment.bytes": "1048576"})])
        described = admin.describe_configs([KpConfigResource(KpType.TOPIC, topic)])
        assert described["topic"][topic]["segment.bytes"]["value"] == "1048576"

        for incremental in (True, False):
            value = "7200000" if incremental else "10800000"
            result = admin.alter_configs([KpConfigResource(KpType.TOPIC, topic, configs={"retention.ms": value})],
                                         incremental=incremental)
            assert result["topic"][topic] == "OK"
            configs = admin.describe_configs([KpConfigResource(KpType.TOPIC, topic)])["topic"][topic]
            assert configs["retention.ms"]["value"] == value

        admin.create_partitions({topic: KpNewPartitions(3)})
        assert len(admin.describe_topics([topic])[0]["partitions"]) == 3

        _produce(broker_embedded, topic, 4)
        result = admin.delete_records({KpTopicPartition(topic, 0): 3})
        assert result[KpTopicPartition(topic, 0)]["low_watermark"] == 3

        cluster = admin.describe_cluster()
        assert [b.get("node_id", b.get("broker_id")) for b in cluster["brokers"]] == [0], cluster
        admin.delete_topics([topic])
        assert topic not in admin.list_topics()
    finally:
        admin.close()


def test_describe_configs_errors_and_filters(broker_embedded: Cluster) -> None:
    with broker_embedded.wire() as wire:
        req = request_class(32, 4)
        mod = sys.modules[req.__module__]
        topic = unique_topic("dc")
        wire.create_topic(topic, 1, {"retention.ms": "1000"})
        resources = (make(mod.DescribeConfigsResource, resource_type=2, resource_name=topic,
                          configuration_keys=("retention.ms",)),
                     make(mod.DescribeConfigsResource, resource_type=2, resource_name="no-such-topic",
                          configuration_keys=None),
                     make(mod.DescribeConfigsResource, resource_type=4, resource_name="7", configuration_keys=None))
        r = wire.call(make(req, resources=resources, include_synonyms=True, include_documentation=True))
        found, missing, bad_broker = r.results
        assert [(c.name, c.value, c.config_source) for c in found.configs] == [("retention.ms", "1000", 1)]
        # As Kafka lists them: log.retention.ms has no default of its own (the week is log.retention.hours').
        assert [s.name for s in found.configs[0].synonyms] == ["retention.ms"]
        assert found.configs[0].documentation
        assert missing.error_code == ErrorCode.unknown_topic_or_partition and not missing.configs
        assert bad_broker.error_code == ErrorCode.invalid_request


def test_describe_cluster_and_offset_for_leader_epoch(broker_embedded: Cluster) -> None:
    topic = unique_topic("ofle")
    with broker_embedded.wire() as wire:
        wire.create_topic(topic, 1)
    _produce(broker_embedded, topic, 2)
    with broker_embedded.wire() as wire:
        req = request_class(60, 1)
        r = wire.call(make(req, include_cluster_authorized_operations=False, endpoint_type=1))
        assert r.error_code == ErrorCode.none and [b.broker_id for b in r.brokers] == [0]
        assert r.brokers[0].port == broker_embedded.port and r.cluster_id

        req = request_class(23, 4)
        mod = sys.modules[req.__module__]
        parts = (make(mod.OffsetForLeaderPartition, partition=0, current_leader_epoch=-1, leader_epoch=3),
                 make(mod.OffsetForLeaderPartition, partition=5, current_leader_epoch=-1, leader_epoch=3))
        r = wire.call(make(req, replica_id=-1, topics=(make(mod.OffsetForLeaderTopic, topic=topic, partitions=parts),)))
        ok, unknown = r.topics[0].partitions
        assert (ok.error_code, ok.leader_epoch, ok.end_offset) == (ErrorCode.none, 3, 2)
        assert unknown.error_code == ErrorCode.unknown_topic_or_partition


def test_all_topics_metadata_shows_every_change_at_once(broker_embedded: Cluster) -> None:
    """The broker reuses its all-topics answer between changes; each answer still carries its own request's
    correlation id, and a create, a partition increase and a delete show in the very next answer."""
    admin = _admin(broker_embedded)
    topic = unique_topic("meta-all")

    def partitions(response: object) -> dict[str, int]:
        return {t.name: len(t.partitions) for t in response.topics}  # type: ignore[attr-defined]

    with broker_embedded.wire() as wire:
        first = wire.metadata(None)
        assert topic not in partitions(first)
        # Pipelined: receive() fails on a correlation id it did not send, call() on one out of order.
        all_topics = build(METADATA, topics=None, allow_auto_topic_creation=False,
                           include_cluster_authorized_operations=False, include_topic_authorized_operations=False)
        sent = [wire.send(all_topics) for _ in range(3)]
        answers = [wire.receive() for _ in sent]
        assert [corr for corr, _ in answers] == sent
        assert all(response == first for _, response in answers)

        wire.create_topic(topic, 2)
        assert partitions(wire.metadata(None))[topic] == 2
        admin.create_partitions([NewPartitions(topic, 5)])[topic].result(20)
        grown = wire.metadata(None)
        assert partitions(grown)[topic] == 5
        (shown,) = [t for t in grown.topics if t.name == topic]
        assert [p.partition_index for p in shown.partitions] == list(range(5))
        assert all(p.leader_id == 0 and p.error_code == ErrorCode.none for p in shown.partitions)
        # librdkafka asks with its own version; its answer follows the same changes.
        assert len(admin.list_topics(timeout=10).topics[topic].partitions) == 5

        admin.delete_topics([topic])[topic].result(20)
        assert topic not in partitions(wire.metadata(None))
        assert topic not in admin.list_topics(timeout=10).topics


def test_create_partitions_validate_only_and_duplicates(broker_embedded: Cluster) -> None:
    topic = unique_topic("cp")
    with broker_embedded.wire() as wire:
        wire.create_topic(topic, 1)
        req = request_class(37, 3)
        mod = sys.modules[req.__module__]
        t = make(mod.CreatePartitionsTopic, name=topic, count=5, assignments=None)
        r = wire.call(make(req, topics=(t,), timeout=datetime.timedelta(seconds=5), validate_only=True))
        assert r.results[0].error_code == ErrorCode.none
        assert len(wire.metadata([topic]).topics[0].partitions) == 1
        r = wire.call(make(req, topics=(t, t), timeout=datetime.timedelta(seconds=5), validate_only=False))
        assert [x.error_code for x in r.results] == [ErrorCode.invalid_request] * 2
        missing = make(mod.CreatePartitionsTopic, name="no-such-topic-xyz", count=2, assignments=None)
        r = wire.call(make(req, topics=(missing,), timeout=datetime.timedelta(seconds=5), validate_only=False))
        assert r.results[0].error_code == ErrorCode.unknown_topic_or_partition


def test_compression_type_recompresses_on_produce(broker_embedded: Cluster) -> None:
    from confluent_kafka import Consumer

    from kafscale.storage.batch import split_batches

    topic = unique_topic("recompress")
    with broker_embedded.wire() as wire:
        wire.create_topic(topic, 1, {"compression.type": "zstd"})
    p = Producer({"bootstrap.servers": broker_embedded.bootstrap, "compression.type": "none",
                  "enable.idempotence": True, "linger.ms": 5})
    for i in range(20):
        p.produce(topic, key=f"k{i}".encode(), value=b"x" * 200, headers=[("h", f"{i}".encode())], partition=0)
    assert p.flush(15) == 0
    with broker_embedded.wire() as wire:
        raw = bytes(wire.fetch(topic, 0, 0).records)
    batches = split_batches(raw)
    assert batches and all(h.compression == 4 and h.producer_id >= 0 for _, h in batches)
    c = Consumer({"bootstrap.servers": broker_embedded.bootstrap, "group.id": f"g-{topic}",
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        got = []
        while len(got) < 20:
            m = c.poll(10)
            assert m is not None and m.error() is None
            got.append((m.offset(), m.key(), m.value(), m.headers()))
        assert got == [(i, f"k{i}".encode(), b"x" * 200, [("h", f"{i}".encode())]) for i in range(20)]
    finally:
        c.close()
