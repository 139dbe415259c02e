"""Topics with virtual partitions (kafscale.virtual.partitions, or a mapping file): what clients see and do.

Clients see V partitions; each has its own offsets, producer sequences and committed offsets. The physical
partition a virtual one lives in decides where it is placed: a physical partition's virtual partitions are on one
shard and move together.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions, NewTopic

from kafscale.config import BrokerConfig
from kafscale.protocol.errors import ErrorCode
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.local_store import LocalDirStore
from kafscale.testing.inprocess import InProcessBroker
from tests.integration.conftest import Cluster, unique_topic
from tests.integration.test_broker_errors import batch, rows
from tests.integration.virtual_workload import check_consumed, consume_as_a_group, embedded_broker, lag, produce_keyed

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

VIRTUAL = "kafscale.virtual.partitions"


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def _create(bootstrap: str, topic: NewTopic) -> None:
    admin = _admin(bootstrap)  # held until the answer: a destroyed client fails its futures
    admin.create_topics([topic])[topic.topic].result(20)


def _refusal(bootstrap: str, topic: NewTopic) -> KafkaException:
    with pytest.raises(KafkaException) as e:
        _create(bootstrap, topic)
    return e.value


def test_a_virtual_topic_shows_its_virtual_partitions_and_keeps_each_ones_records_apart(broker: Cluster) -> None:
    topic = unique_topic("virtual")
    _create(broker.bootstrap, NewTopic(topic, 3, config={VIRTUAL: "12"}))
    described = _admin(broker.bootstrap).list_topics(topic, timeout=20).topics[topic]
    assert sorted(described.partitions) == list(range(12))

    group = unique_topic("virtual-group")
    consumers = [Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                           "enable.auto.commit": False}) for _ in range(2)]
    for c in consumers:
        c.subscribe([topic])
    # Both members hold their share before anything is produced. A member that joined later than the other would
    # find every record read already (and nothing to commit), or take partitions over halfway through them.
    deadline = time.monotonic() + 60
    while sum(len(c.assignment()) for c in consumers) != 12 or not all(c.assignment() for c in consumers):
        assert time.monotonic() < deadline, f"assignments {[len(c.assignment()) for c in consumers]} of 12"
        for c in consumers:
            assert c.consume(100, 0.2) == [], "a record before any was produced"

    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 5})
    placed: dict[int, int] = {}  # record -> the partition the client's partitioner chose

    def delivered(err: object, msg: object) -> None:
        assert err is None, err
        placed[int(msg.value())] = msg.partition()  # type: ignore[attr-defined]

    for i in range(600):
        producer.produce(topic, key=f"k{i % 40}".encode(), value=f"{i}".encode(), on_delivery=delivered)
    assert producer.flush(30) == 0

    got: dict[int, list[tuple[int, bytes, bytes]]] = defaultdict(list)
    owners: dict[int, set[int]] = defaultdict(set)
    deadline = time.monotonic() + 60
    while sum(len(v) for v in got.values()) < 600 and time.monotonic() < deadline:
        for n, c in enumerate(consumers):
            for m in c.consume(100, 0.2):
                assert m.error() is None, m.error()
                got[m.partition()].append((m.offset(), m.key(), m.value()))
                owners[m.partition()].add(n)
    for n, c in enumerate(consumers):
        if any(n in ns for ns in owners.values()):  # a member that read nothing has no offset to commit (_NO_OFFSET)
            c.commit(asynchronous=False)
    assert sum(len(v) for v in got.values()) == 600
    assert sorted(int(v) for records in got.values() for _, _, v in records) == list(range(600))  # exactly once
    assert len(got) == 12, f"records in {sorted(got)} of the 12 virtual partitions"
    for partition, records in got.items():
        assert [o for o, _, _ in records] == list(range(len(records))), f"partition {partition}: own dense offsets"
        values = [int(v) for _, _, v in records]
        assert values == sorted(values), f"partition {partition}: in the order produced"
        assert {placed[v] for v in values} == {partition}, f"partition {partition}: only the records sent to it"
    assert all(len(ns) == 1 for ns in owners.values()), "each virtual partition read by one member"

    stored = broker.object_keys(topic)
    assert stored and {k.rsplit("/", 2)[1] for k in stored} <= {"0", "1", "2"}, "objects of the 3 physical only"
    assert all(k.endswith(".kfp") for k in stored), "every segment in a pack"

    committed = consumers[0].committed([TopicPartition(topic, p) for p in range(12)], timeout=20)
    assert {tp.partition: tp.offset for tp in committed} == {p: len(got[p]) for p in range(12)}
    for c in consumers:
        c.close()


def test_a_virtual_topics_config_is_shown_and_cannot_change(broker_embedded: Cluster) -> None:
    admin = _admin(broker_embedded.bootstrap)
    topic = unique_topic("virtual-config")
    _create(broker_embedded.bootstrap, NewTopic(topic, 2, config={VIRTUAL: "8", "retention.ms": "3600000"}))
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([res])[res].result(20)
    assert configs[VIRTUAL].value == "8" and configs[VIRTUAL].is_read_only

    change = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry(VIRTUAL, "16", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(KafkaException) as e:
        admin.incremental_alter_configs([change])[change].result(20)
    assert e.value.args[0].code() == ErrorCode.invalid_config
    assert "set at creation" in e.value.args[0].str()

    # AlterConfigs replaces every config it does not name, except the ones fixed at creation.
    admin.alter_configs([ConfigResource(ConfigResource.Type.TOPIC, topic,
                                        set_config={"retention.ms": "7200000"})])[res].result(20)
    configs = admin.describe_configs([res])[res].result(20)
    assert configs[VIRTUAL].value == "8" and configs["retention.ms"].value == "7200000"
    assert len(admin.list_topics(topic, timeout=20).topics[topic].partitions) == 8

    grown = admin.create_partitions([NewPartitions(topic, 16)])[topic]
    with pytest.raises(KafkaException) as e:
        grown.result(20)
    assert e.value.args[0].code() == ErrorCode.invalid_partitions
    assert "virtual partitions (8 over 2 physical)" in e.value.args[0].str()


@pytest.mark.parametrize(("physical", "virtual", "message"), [
    (4, "10", "must be a multiple of physical partitions"),
    (4, "2", "at least the physical 4"),
    (4, "many", "Not a number of type INT"),
])
def test_a_bad_virtual_partition_count_is_refused_naming_it(broker_embedded: Cluster, physical: int, virtual: str,
                                                            message: str) -> None:
    topic = unique_topic("virtual-bad")
    error = _refusal(broker_embedded.bootstrap, NewTopic(topic, physical, config={VIRTUAL: virtual})).args[0]
    assert error.code() == ErrorCode.invalid_config and message in error.str(), error.str()
    assert topic not in _admin(broker_embedded.bootstrap).list_topics(timeout=20).topics


def test_a_virtual_partition_beyond_the_count_is_unknown(broker_embedded: Cluster) -> None:
    topic = unique_topic("virtual-range")
    with broker_embedded.wire() as wire:
        wire.create_topic(topic, 2, {VIRTUAL: "4"})
        assert wire.produce(topic, 3, batch(rows("x", 2))).error_code == ErrorCode.none
        for partition in (4, 99):
            answer = wire.produce(topic, partition, batch(rows("x", 2)))
            assert answer.error_code == ErrorCode.unknown_topic_or_partition
        assert wire.end_offsets(topic, 4) == [0, 0, 0, 2]


MAPPING = """
mapping:
  topics:
    orders:
      virtual_partitions: 12
      physical_partitions: 3
    "events-.*":
      virtual_partitions: 8
      physical_partitions: 4
"""


@pytest.fixture(scope="module")
def mapped(tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    root = tmp_path_factory.mktemp("mapped")
    (root / "mapping.yaml").write_text(MAPPING)
    config = BrokerConfig(shards_per_node=1, virtual_partitions_mapping=str(root / "mapping.yaml"))
    broker = InProcessBroker(config, meta=lambda: EmbeddedStore(root / "meta.db"),
                             objects=lambda: LocalDirStore(root / "objects")).start()
    view = LocalDirStore(root / "objects")
    try:
        yield Cluster("mapped", broker, view)
    finally:
        broker.stop()
        view.close()


def test_a_mapping_file_lays_out_topics_it_names(mapped: Cluster) -> None:
    admin = _admin(mapped.bootstrap)
    _create(mapped.bootstrap, NewTopic("orders", -1))  # the mapping's layout
    _create(mapped.bootstrap, NewTopic("events-eu", 8))  # the virtual count asked for: the same
    _create(mapped.bootstrap, NewTopic("plain", 3))
    topics = admin.list_topics(timeout=20).topics
    assert len(topics["orders"].partitions) == 12 and len(topics["events-eu"].partitions) == 8
    assert len(topics["plain"].partitions) == 3
    res = ConfigResource(ConfigResource.Type.TOPIC, "orders")
    assert admin.describe_configs([res])[res].result(20)[VIRTUAL].value == "12"

    error = _refusal(mapped.bootstrap, NewTopic("events-us", 5)).args[0]
    assert error.code() == ErrorCode.invalid_partitions
    assert "gives topic 'events-us' 8 partitions over 4 physical" in error.str()

    # A topic created on first use gets the mapping's layout too.
    producer = Producer({"bootstrap.servers": mapped.bootstrap})
    producer.produce("events-auto", value=b"x", partition=7)
    assert producer.flush(20) == 0
    assert len(admin.list_topics("events-auto", timeout=20).topics["events-auto"].partitions) == 8


def test_serve_refuses_a_bad_mapping_file_naming_the_topic(tmp_path: Path) -> None:
    bad = tmp_path / "mapping.yaml"
    bad.write_text("mapping:\n  topics:\n    orders: {virtual_partitions: 25, physical_partitions: 10}\n")
    done = subprocess.run([sys.executable, "-m", "kafscale.cli", "serve", "--data-dir", str(tmp_path / "data"),
                           "--virtual-partitions-mapping", str(bad)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "topic 'orders'" in done.stderr and "must be a multiple" in done.stderr and str(bad) in done.stderr


def test_100_virtual_over_10_physical_with_six_members_of_two_clients_and_a_restart(tmp_path: Path) -> None:
    """The issue's workload: keyed producers, six members (confluent-kafka and kafka-python) of one group. Every
    record is consumed once, by the member owning its virtual partition, in per-key order; lag per virtual
    partition is right; committed offsets survive a broker restart; only the 10 physical partitions are stored."""
    topic, group = "orders", "orders-app"
    b = embedded_broker(tmp_path)
    try:
        _create(b.bootstrap, NewTopic(topic, 10, config={VIRTUAL: "100"}))
        sent, members = consume_as_a_group(b.bootstrap, topic, group, 3000)
        check_consumed(sent, members)

        more = produce_keyed(b.bootstrap, topic, 3000, 500)  # not consumed: the group's lag
        expected_lag = Counter(p for p, _ in more.values())
        assert lag(b.bootstrap, topic, group) == {p: expected_lag.get(p, 0) for p in range(100)}
    finally:
        b.stop()
    b = embedded_broker(tmp_path)  # the same stores, a new process's view
    try:
        assert lag(b.bootstrap, topic, group) == {p: expected_lag.get(p, 0) for p in range(100)}
        assert {k.rsplit("/", 2)[1] for k in _stored(tmp_path, topic)} == {str(p) for p in range(10)}
        assert all(k.endswith(".kfp") for k in _stored(tmp_path, topic))
    finally:
        b.stop()


def _stored(root: Path, topic: str) -> list[str]:
    return [str(p.relative_to(root / "objects")) for p in (root / "objects" / "default" / topic).rglob("*")
            if p.is_file()]
