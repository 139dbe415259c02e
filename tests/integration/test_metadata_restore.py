"""The restore drill (docs/operations.md, "Backups and restores") on etcd and SeaweedFS, through the CLI:
produce, snapshot, produce more, wipe etcd, restore. Every acknowledged record is readable at its offset, the
group's committed offsets are back, and new records continue at the right offsets. Then the same without a
snapshot (`rebuild`), which loses only the group offsets."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from kafscale.cli import main as cli
from kafscale.config import BrokerConfig
from kafscale.storage.etcd_store import EtcdStore
from kafscale.testing.etcd_server import EtcdServer
from kafscale.testing.inprocess import InProcessBroker
from kafscale.testing.s3_servers import SeaweedS3Server, unique_bucket_name

pytestmark = [pytest.mark.timeout(180), pytest.mark.etcd]
PARTITIONS = 3
TOPIC = "drill"
VIRTUAL = "kafscale.virtual.partitions"


@dataclass
class Stores:
    etcd: EtcdServer
    seaweed: SeaweedS3Server
    prefix: str
    bucket: str
    packs: bool = True  # pack_segments

    def broker(self) -> InProcessBroker:
        config = BrokerConfig(metrics_listen="", flush_interval_ms=20, pack_segments=self.packs)
        return InProcessBroker(config, meta=lambda: EtcdStore(self.etcd.endpoint, prefix=self.prefix),
                               objects=lambda: self.seaweed.store(self.bucket, create_bucket=False))

    def argv(self, command: str) -> list[str]:
        return ["metadata", command, "--etcd-endpoints", self.etcd.endpoint, "--etcd-prefix", self.prefix,
                "--s3-bucket", self.bucket, "--s3-endpoint", self.seaweed.endpoint_url,
                "--s3-access-key", self.seaweed.access_key, "--s3-secret-key", self.seaweed.secret_key]

    def cli(self, command: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
        capsys.readouterr()
        code = cli([*self.argv(command), "--output", "json"])
        out = capsys.readouterr()
        assert code == 0, out.err
        return json.loads(out.out)

    def cli_failing(self, command: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
        capsys.readouterr()
        code = cli(self.argv(command))
        return code, capsys.readouterr().err

    def wipe(self) -> None:
        async def run() -> int:
            store = EtcdStore(self.etcd.endpoint, prefix=self.prefix)
            try:
                return await store.delete("", prefix=True)
            finally:
                await store.close()

        assert asyncio.run(run()) > 0


# A plain topic whose partitions' segments a shard packs together (the default), one whose segments are objects of
# their own (`pack_segments` off), and a virtual topic (packs by physical partition).
LAYOUTS = ["plain", "plain-objects", "virtual"]


@pytest.fixture
def stores(etcd_server: EtcdServer, seaweed_server: SeaweedS3Server) -> Iterator[Stores]:
    bucket = unique_bucket_name("drill")
    seaweed_server.store(bucket).close()
    yield Stores(etcd_server, seaweed_server, f"/drill-{uuid.uuid4().hex[:8]}/", bucket)
    seaweed_server.delete_bucket(bucket)


def produce(bootstrap: str, start: int, n: int) -> dict[tuple[int, int], bytes]:
    acked: dict[tuple[int, int], bytes] = {}
    failed: list[KafkaError] = []

    def delivered(err: KafkaError | None, msg: Any) -> None:
        if err is None:
            acked[(msg.partition(), msg.offset())] = msg.value()
        else:
            failed.append(err)

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 5})
    for i in range(start, start + n):
        producer.produce(TOPIC, value=f"r{i}".encode(), partition=i % PARTITIONS, on_delivery=delivered)
        if i % 50 == 0:
            producer.flush(30)  # several segments per partition
    assert producer.flush(30) == 0 and not failed, failed
    return acked


def read_all(bootstrap: str, n: int) -> dict[tuple[int, int], bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex[:6]}"})
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    got: dict[tuple[int, int], bytes] = {}
    deadline = time.monotonic() + 30
    try:
        while len(got) < n and time.monotonic() < deadline:
            for m in consumer.consume(500, 0.5):
                if m.error() is None:
                    got[(m.partition(), m.offset())] = m.value()
    finally:
        consumer.close()
    return got


def committed(bootstrap: str) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "app"})
    try:
        return [tp.offset for tp in consumer.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], 15)]
    finally:
        consumer.close()


def commit(bootstrap: str, offsets: list[int]) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "app", "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(TOPIC, p, o) for p, o in enumerate(offsets)], asynchronous=False)
    finally:
        consumer.close()


def ends(acked: dict[tuple[int, int], bytes]) -> list[int]:
    return [max(o for (p, o) in acked if p == q) + 1 for q in range(PARTITIONS)]


def new_topic(virtual: bool, configs: dict[str, str] | None = None) -> NewTopic:
    """The drill's topic: PARTITIONS plain partitions, or as many virtual ones over one physical partition (their
    segments stored together in packs: docs/virtual-partitions.md)."""
    if virtual:
        return NewTopic(TOPIC, 1, config={**(configs or {}), VIRTUAL: str(PARTITIONS)})
    return NewTopic(TOPIC, PARTITIONS, config=configs or {})


@pytest.mark.parametrize("layout", LAYOUTS)
def test_restore_drill(stores: Stores, capsys: pytest.CaptureFixture[str], layout: str) -> None:
    virtual, stores.packs = layout == "virtual", layout != "plain-objects"
    with stores.broker() as b:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([new_topic(virtual, {"retention.ms": "86400000"})])[TOPIC].result(30)
        acked = produce(b.bootstrap, 0, 300)
        commit(b.bootstrap, [40, 50, 60])
        taken = stores.cli("snapshot", capsys)
        assert taken["keys"] > 0 and taken["key"].startswith("default/@metadata/snapshot-")
        acked |= produce(b.bootstrap, 300, 300)  # committed after the snapshot: found in the segments
        before = ends(acked)
    stores.wipe()
    restored = stores.cli("restore", capsys)
    assert restored["snapshot"] == taken["key"] and restored["partitions"] == PARTITIONS
    assert restored["segments"] > 0

    with stores.broker() as b:
        got = read_all(b.bootstrap, len(acked))
        for key, value in acked.items():
            assert got.get(key) == value, f"acknowledged record at partition/offset {key} lost after the restore"
        assert len(got) == len(acked)
        assert committed(b.bootstrap) == [40, 50, 60]
        admin, resource = AdminClient({"bootstrap.servers": b.bootstrap}), _topic_resource()
        configs = admin.describe_configs([resource])[resource].result(15)
        assert configs["retention.ms"].value == "86400000"
        assert (VIRTUAL in configs) == virtual
        after = produce(b.bootstrap, 600, PARTITIONS)
        assert sorted(after) == sorted((p, before[p]) for p in range(PARTITIONS)), "an offset was reused or skipped"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rebuild_from_the_segments_alone(stores: Stores, capsys: pytest.CaptureFixture[str], layout: str) -> None:
    virtual, stores.packs = layout == "virtual", layout != "plain-objects"
    with stores.broker() as b:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([new_topic(virtual)])[TOPIC].result(30)
        acked = produce(b.bootstrap, 0, 400)
        assert stored_kinds(stores) == ({"kfp"} if stores.packs else {"kfs", "index"}), "packs only, or none"
        commit(b.bootstrap, [10, 10, 10])
        before = ends(acked)
    stores.wipe()
    code, err = stores.cli_failing("restore", capsys)  # there is no snapshot to restore
    assert code == 1 and "no snapshot" in err and "kafscale metadata rebuild" in err
    rebuilt = stores.cli("rebuild", capsys)
    assert rebuilt["snapshot"] == "" and rebuilt["partitions"] == PARTITIONS

    with stores.broker() as b:
        got = read_all(b.bootstrap, len(acked))
        assert got == acked
        assert committed(b.bootstrap) == [-1001] * PARTITIONS  # group offsets are not in the segments
        admin, resource = AdminClient({"bootstrap.servers": b.bootstrap}), _topic_resource()
        configs = admin.describe_configs([resource])[resource].result(15)
        assert (configs[VIRTUAL].value if VIRTUAL in configs else None) == (str(PARTITIONS) if virtual else None)
        after = produce(b.bootstrap, 400, PARTITIONS)
        assert sorted(after) == sorted((p, before[p]) for p in range(PARTITIONS))


def _topic_resource() -> Any:
    from confluent_kafka.admin import ConfigResource

    return ConfigResource(ConfigResource.Type.TOPIC, TOPIC)


def stored_kinds(stores: Stores) -> set[str]:
    """The suffixes of the drill topic's objects: kfs and index for segments, kfp for packs."""
    objects = stores.seaweed.store(stores.bucket, create_bucket=False)
    try:
        return {o.key.rsplit(".", 1)[1] for o in objects.list(f"default/{TOPIC}/")}
    finally:
        objects.close()


def read_topic(bootstrap: str, topic: str, isolation: str = "read_committed",
               partition: int = 0) -> dict[int, bytes | None]:
    """A partition of `topic` from its log start to its end (offset -> value), as a consumer reads it."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex[:6]}",
                         "isolation.level": isolation, "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, partition, -2)])  # OFFSET_BEGINNING: the log start, wherever it is
    got: dict[int, bytes | None] = {}
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF:
                    return got
                continue
            got[m.offset()] = m.value()
    finally:
        consumer.close()
    raise AssertionError(f"{topic} not read to its end in 30 s: {len(got)} records")


@pytest.mark.parametrize("how", ["restore", "rebuild"])
def test_a_restore_or_rebuild_after_cleanings_and_transactions(stores: Stores, capsys: pytest.CaptureFixture[str],
                                                              how: str) -> None:
    """Segments a cleaning wrote (keys ending -c{pass}) stand for the ones they replaced, which the janitor has
    deleted, also when the snapshot restored was taken before the cleaning; aborted transactions stay hidden from
    read_committed consumers, and a transactional producer carries on."""
    config = BrokerConfig(metrics_listen="", flush_interval_ms=20, log_cleaner_backoff_ms=300,
                          janitor_interval_s=1, orphan_grace_s=0)
    broker = InProcessBroker(config, meta=lambda: EtcdStore(stores.etcd.endpoint, prefix=stores.prefix),
                             objects=lambda: stores.seaweed.store(stores.bucket, create_bucket=False))
    with broker as b:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        waiting = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": "3600000"}
        for f in admin.create_topics([NewTopic("kv", 1, config=waiting), NewTopic("tx", 1)]).values():
            f.result(30)
        producer = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5})
        for version in range(4):
            for k in range(20):
                producer.produce("kv", key=b"k%d" % k, value=b"v%d-%d" % (k, version))
            assert producer.flush(30) == 0  # a segment each
        txn = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "drill-txn"})
        txn.init_transactions(30)
        for outcome, n in (("commit", 3), ("abort", 4), ("commit", 5)):
            txn.begin_transaction()
            for i in range(n):
                txn.produce("tx", value=f"{outcome}-{i}".encode())
            assert txn.flush(30) == 0  # in the log, also those of the transaction to abort
            txn.commit_transaction(30) if outcome == "commit" else txn.abort_transaction(30)
        if how == "restore":
            stores.cli("snapshot", capsys)  # before any cleaning
        resource = ConfigResource(ConfigResource.Type.TOPIC, "kv", incremental_configs=[
            ConfigEntry("min.compaction.lag.ms", "0", incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([resource])[resource].result(30)

        def cleaned_alone() -> bool:  # compacted, and the replaced objects gone
            keys = [k for k in stored_keys(stores, "kv/0/") if k.endswith(".kfs")]
            return any("-c" in k for k in keys) and len(keys) <= 2
        deadline = time.monotonic() + 60
        while not cleaned_alone():
            assert time.monotonic() < deadline, f"no cleaning, or its leftovers stayed: {stored_keys(stores, 'kv/')}"
            time.sleep(0.3)
        kv, tx = read_topic(b.bootstrap, "kv"), read_topic(b.bootstrap, "tx")
        assert len(read_topic(b.bootstrap, "tx", "read_uncommitted")) == 12
    assert sorted(kv.values()) == sorted(b"v%d-3" % k for k in range(20))  # only the latest of each key
    assert sorted(tx.values()) == sorted([f"commit-{i}".encode() for i in range(3)] +
                                         [f"commit-{i}".encode() for i in range(5)])
    stores.wipe()
    stores.cli(how, capsys)

    with stores.broker() as b:
        assert read_topic(b.bootstrap, "kv") == kv
        assert read_topic(b.bootstrap, "tx") == tx  # the aborted records stay hidden
        assert len(read_topic(b.bootstrap, "tx", "read_uncommitted")) == 12
        txn = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "drill-txn"})
        txn.init_transactions(30)
        txn.begin_transaction()
        txn.produce("tx", value=b"after")
        txn.commit_transaction(30)
        after = read_topic(b.bootstrap, "tx")
        assert after[max(after)] == b"after" and max(after) > max(tx)


@pytest.mark.parametrize("how", ["restore", "rebuild"])
def test_a_restore_or_rebuild_of_cleaned_virtual_partitions(stores: Stores, capsys: pytest.CaptureFixture[str],
                                                            how: str) -> None:
    """A compacted topic of 4 virtual partitions over 2: each lane's cleaned segments (objects of the lane's own)
    stand for the pack ranges they replaced, whose packs the janitor deleted, also when the snapshot restored
    was taken before the cleaning."""
    config = BrokerConfig(metrics_listen="", flush_interval_ms=20, log_cleaner_backoff_ms=300,
                          janitor_interval_s=1, orphan_grace_s=0)
    broker = InProcessBroker(config, meta=lambda: EtcdStore(stores.etcd.endpoint, prefix=stores.prefix),
                             objects=lambda: stores.seaweed.store(stores.bucket, create_bucket=False))
    lanes = 4
    with broker as b:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic("kvv", 2, config={
            "cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": "3600000",
            "kafscale.virtual.partitions": str(lanes)})])["kvv"].result(30)
        producer = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5})
        for version in range(4):
            for lane in range(lanes):
                for k in range(10):
                    producer.produce("kvv", key=b"k%d" % k, value=b"l%d-v%d-%d" % (lane, k, version), partition=lane)
            assert producer.flush(30) == 0
        packs = {k for k in stored_keys(stores, "kvv/") if k.endswith(".kfp")}
        assert packs, "the lanes' segments are not in packs"
        if how == "restore":
            stores.cli("snapshot", capsys)  # before any cleaning
        resource = ConfigResource(ConfigResource.Type.TOPIC, "kvv", incremental_configs=[
            ConfigEntry("min.compaction.lag.ms", "0", incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([resource])[resource].result(30)

        def cleaned_alone() -> bool:  # every lane compacted into objects of its own, and the old packs gone
            keys = stored_keys(stores, "kvv/")
            return not packs & set(keys) and all(any(k.startswith(f"default/kvv/{lane}/") and "-c" in k
                                                     for k in keys) for lane in range(lanes))
        deadline = time.monotonic() + 90
        while not cleaned_alone():
            assert time.monotonic() < deadline, f"no cleaning, or its packs stayed: {stored_keys(stores, 'kvv/')}"
            time.sleep(0.3)
        before = {lane: read_topic(b.bootstrap, "kvv", partition=lane) for lane in range(lanes)}
    for lane in range(lanes):
        assert sorted(before[lane].values()) == sorted(b"l%d-v%d-3" % (lane, k) for k in range(10))
    stores.wipe()
    stores.cli(how, capsys)

    with stores.broker() as b:
        assert {lane: read_topic(b.bootstrap, "kvv", partition=lane) for lane in range(lanes)} == before


def stored_keys(stores: Stores, prefix: str) -> list[str]:
    objects = stores.seaweed.store(stores.bucket, create_bucket=False)
    try:
        return [o.key for o in objects.list(f"default/{prefix}")]
    finally:
        objects.close()
