"""Retention: whole segments past retention.ms / beyond retention.bytes vanish from the object store, the
log start offset moves (durably), fetches below it are OFFSET_OUT_OF_RANGE, and nothing newer is touched.

Brokers of their own (a short retention check interval), on the embedded stores and on etcd + SeaweedFS.
Record timestamps are set by the producer, so "old" is decided by data, not by how fast the test runs.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from kafscale.cluster import keys
from kafscale.config import BrokerConfig
from kafscale.protocol.errors import ErrorCode
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.etcd_store import EtcdStore
from kafscale.storage.local_store import LocalDirStore
from kafscale.storage.object_store import ObjectStore
from kafscale.storage.segment import SegmentReader
from kafscale.testing.etcd_server import EtcdServer
from kafscale.testing.inprocess import InProcessBroker
from kafscale.testing.s3_servers import SeaweedS3Server, unique_bucket_name
from tests.integration.conftest import NAMESPACE, Cluster, unique_topic, wait_until

pytestmark = pytest.mark.timeout(120)
HOUR_MS = 3_600_000


def _config() -> BrokerConfig:
    return BrokerConfig(shards_per_node=1, s3_namespace=NAMESPACE, retention_check_interval_ms=100)


@pytest.fixture(scope="module", params=["embedded", "cloud"])
def retention_broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if request.param == "embedded":
        root = tmp_path_factory.mktemp("retention")
        broker = InProcessBroker(_config(), meta=lambda: EmbeddedStore(root / "meta.sqlite"),
                                 objects=lambda: LocalDirStore(root / "objects")).start()
        view: ObjectStore = LocalDirStore(root / "objects")
        cleanup = None
    else:
        etcd: EtcdServer = request.getfixturevalue("etcd_server")
        seaweed: SeaweedS3Server = request.getfixturevalue("seaweed_server")
        bucket, prefix = unique_bucket_name("kafscale-ret"), f"/kafscale-ret-{uuid.uuid4().hex[:8]}/"
        broker = InProcessBroker(_config(), meta=lambda: EtcdStore(etcd.endpoint, prefix=prefix),
                                 objects=lambda: seaweed.store(bucket, create_bucket=True)).start()
        view = seaweed.store(bucket, create_bucket=False)

        def cleanup() -> None:
            seaweed.delete_bucket(bucket)
    try:
        yield Cluster(request.param, broker, view)
    finally:
        broker.stop()
        view.close()
        if cleanup:
            cleanup()


def _produce(cluster: Cluster, topic: str, timestamps_ms: list[int]) -> None:
    """One record per flush window (acks=all, flushed one at a time): one segment per record."""
    p = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 0, "enable.idempotence": False})
    for ts in timestamps_ms:
        p.produce(topic, value=f"value-at-{ts}".encode(), partition=0, timestamp=ts)
        assert p.flush(15) == 0


def _segment_bases(cluster: Cluster, topic: str) -> list[int]:
    return [s.base for s in cluster.stored_segments(topic)]


def _log_start_in_store(cluster: Cluster, topic: str) -> int:
    meta = cluster.broker.meta
    assert meta is not None
    kv = cluster.broker.run(meta.get(keys.state(topic, 0)))
    return int(kv.value["log_start_offset"])


def test_time_retention_deletes_only_expired_segments(retention_broker: Cluster) -> None:
    cluster = retention_broker
    topic = unique_topic("retention-ms")
    with cluster.wire() as wire:
        wire.create_topic(topic, 1, {"retention.ms": str(HOUR_MS)})
    now = int(time.time() * 1000)
    _produce(cluster, topic, [now - 3 * HOUR_MS + i for i in range(4)] + [now + i for i in range(3)])

    # The four two-hours-too-old segments go; the three recent ones stay, byte for byte.
    wait_until(lambda: _segment_bases(cluster, topic) == [4, 5, 6], timeout=30, what="expired segments deleted")
    assert all(SegmentReader(cluster.segment_bytes(s)).info.base_offset >= 4 for s in cluster.stored_segments(topic))
    assert _log_start_in_store(cluster, topic) == 4
    with cluster.wire() as wire:
        assert wire.list_offset(topic, 0, -2).offset == 4
        assert wire.list_offset(topic, 0, -1).offset == 7
        for offset in (0, 3):
            answer = wire.fetch(topic, 0, offset)
            # as Kafka: the error carries no offsets (tests/differential/test_fetch.py); ListOffsets tells them
            assert answer.error_code == ErrorCode.offset_out_of_range and answer.log_start_offset == -1
        assert wire.fetch(topic, 0, 4).error_code == ErrorCode.none

    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"g-{topic}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])  # below the log start: reset to earliest
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 3 and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and m.error() is None:
                got.append((m.offset(), m.value()))
        assert got == [(4 + i, f"value-at-{now + i}".encode()) for i in range(3)]
    finally:
        consumer.close()


def test_size_retention_keeps_the_newest_bytes(retention_broker: Cluster) -> None:
    cluster = retention_broker
    topic = unique_topic("retention-bytes")
    with cluster.wire() as wire:
        wire.create_topic(topic, 1)
    now = int(time.time() * 1000)
    _produce(cluster, topic, [now + i for i in range(5)])
    sizes = {s.base: s.size for s in cluster.stored_segments(topic)}
    assert sorted(sizes) == [0, 1, 2, 3, 4]
    # Kafka's rule: delete the oldest segment while what is left still holds retention.bytes.
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.bytes", str(sizes[3] + sizes[4]), incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(20)

    wait_until(lambda: _segment_bases(cluster, topic) == [3, 4], timeout=30, what="size retention")
    assert _log_start_in_store(cluster, topic) == 3
    with cluster.wire() as wire:
        assert wire.fetch(topic, 0, 2).error_code == ErrorCode.offset_out_of_range
        assert wire.fetch(topic, 0, 3).error_code == ErrorCode.none


def test_dropping_more_segments_than_one_etcd_transaction_holds_moves_the_log_start_in_steps(
        retention_broker: Cluster) -> None:
    """etcd refuses a transaction of more than 128 operations; a retention pass after a long idle time, or a
    DeleteRecords over a long log, drops more segments than that (found by the soak benchmark)."""
    from confluent_kafka.admin import AdminClient

    cluster = retention_broker
    topic = unique_topic("many-segments")
    with cluster.wire() as wire:
        wire.create_topic(topic, 1, {"retention.ms": str(HOUR_MS)})
    now = int(time.time() * 1000)
    _produce(cluster, topic, [now + i for i in range(140)])  # 140 segments of one record each
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    done = admin.delete_records([TopicPartition(topic, 0, 135)])  # 135 deletes and a put: one txn is 128
    assert next(iter(done.values())).result(30).low_watermark == 135
    assert _log_start_in_store(cluster, topic) == 135
    wait_until(lambda: _segment_bases(cluster, topic) == list(range(135, 140)), timeout=30,
               what="the 135 segments below the log start deleted")
