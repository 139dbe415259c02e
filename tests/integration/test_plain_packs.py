"""A plain topic's packs (`pack_segments`, kafscale/broker/packer.py): the segments a shard's partitions flush in
one tick are one object in the topic's `packs/`; every record reads back; retention deletes a pack as soon as the
last partition holding a segment in it drops that segment, and not before; the janitor deletes a pack no commit
will ever name."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafscale.broker import janitor
from kafscale.broker.shard import ShardCore
from kafscale.cluster import keys
from kafscale.config import BrokerConfig
from kafscale.storage import keys as object_keys
from kafscale.storage.batch import set_base_offset
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.local_store import LocalDirStore
from kafscale.storage.pack import build_pack
from kafscale.storage.segment import build_segment
from kafscale.testing.inprocess import InProcessBroker
from tests.unit.fake_broker import record_batch

pytestmark = pytest.mark.timeout(120)
NS = "default"
PARTITIONS, ROUNDS = 6, 5


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[InProcessBroker]:
    b = InProcessBroker(BrokerConfig(metrics_listen="", janitor_interval_s=0),
                        meta=lambda: EmbeddedStore(tmp_path / "meta.db"),
                        objects=lambda: LocalDirStore(tmp_path / "objects"))
    with b:
        yield b


def core(b: InProcessBroker) -> ShardCore:
    assert b.shard is not None
    return b.shard.core


def objects_of(b: InProcessBroker, topic: str) -> list[str]:
    return sorted(o.key for o in b.run(core(b).objects.list(f"{NS}/{topic}/")))


def committed_segments(b: InProcessBroker, topic: str) -> list[dict[str, object]]:
    meta = core(b).meta
    return [kv.value for p in range(PARTITIONS) for kv in b.run(meta.range(keys.segments(topic, p)))]


def write_rounds(b: InProcessBroker, topic: str) -> None:
    """ROUNDS times a record to every partition, sent together and acknowledged before the next round."""
    admin = AdminClient({"bootstrap.servers": b.bootstrap})  # held until the answer is in
    admin.create_topics([NewTopic(topic, PARTITIONS)])[topic].result(15)
    producer = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5})
    for r in range(ROUNDS):
        for p in range(PARTITIONS):
            producer.produce(topic, value=f"p{p}r{r}".encode(), partition=p)
        assert producer.flush(30) == 0


def read(b: InProcessBroker, topic: str, partition: int, offset: int = 0) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": b.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}"})
    consumer.assign([TopicPartition(topic, partition, offset)])
    got: list[bytes] = []
    deadline = time.monotonic() + 20
    try:
        while len(got) < ROUNDS - offset and time.monotonic() < deadline:
            got += [m.value() for m in consumer.consume(100, 0.5) if m.error() is None]
    finally:
        consumer.close()
    return got


def delete_records(b: InProcessBroker, topic: str, partitions: range) -> None:
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    done = admin.delete_records([TopicPartition(topic, p, ROUNDS) for p in partitions])
    assert all(f.result(15).low_watermark == ROUNDS for f in done.values())


def test_a_ticks_segments_are_one_object_in_the_topics_packs(broker: InProcessBroker) -> None:
    write_rounds(broker, "pt")
    stored = objects_of(broker, "pt")
    segments = committed_segments(broker, "pt")
    assert len(segments) >= PARTITIONS * ROUNDS  # each acknowledged round flushed every partition
    assert stored and all(k.startswith(object_keys.packs_prefix(NS, "pt")) for k in stored), stored
    assert {s["pack"] for s in segments} == {object_keys.pack_name_of(k, NS, "pt") for k in stored}
    # A round's six segments were sealed on one tick (a tick between two partitions' appends splits a round).
    assert len(stored) <= 2 * ROUNDS, f"{len(stored)} packs for {len(segments)} segments"
    for p in range(PARTITIONS):
        assert read(broker, "pt", p) == [f"p{p}r{r}".encode() for r in range(ROUNDS)]


def test_retention_deletes_a_pack_once_its_last_partition_drops_it(broker: InProcessBroker) -> None:
    write_rounds(broker, "pt")
    stored = objects_of(broker, "pt")
    delete_records(broker, "pt", range(PARTITIONS - 1))
    assert objects_of(broker, "pt") == stored, "the last partition still reads every pack"
    assert read(broker, "pt", PARTITIONS - 1) == [f"p{PARTITIONS - 1}r{r}".encode() for r in range(ROUNDS)]
    delete_records(broker, "pt", range(PARTITIONS - 1, PARTITIONS))
    assert objects_of(broker, "pt") == [], "each pack went with the last segment in it"


def test_the_janitor_deletes_a_pack_no_commit_will_name(broker: InProcessBroker) -> None:
    write_rounds(broker, "pt")
    c = core(broker)
    stored = objects_of(broker, "pt")
    # A dead writer's upload (owner epoch 0, this owner's is 1) at partition 0's base 0, and one of the current
    # writer past partition 2's end, whose commit may still come.
    leftover, pending = (object_keys.pack_key(NS, "pt", object_keys.pack_name(None, uuid.uuid4().hex))
                         for _ in range(2))
    batch = record_batch(b"never acknowledged")
    broker.run(c.objects.put(leftover, build_pack([(0, 0, build_segment([batch], created_ms=1))], 0,
                                                  PARTITIONS).data))
    late = record_batch(b"not acknowledged yet")
    set_base_offset(late, 0, 10 ** 6)  # far past the end
    broker.run(c.objects.put(pending, build_pack([(2, 1, build_segment([late], created_ms=1))], 0,
                                                 PARTITIONS).data))
    lanes = list(range(PARTITIONS))
    assert broker.run(janitor.sweep_packs(c.meta, c.objects, NS, "pt", None, lanes, grace_s=3600)) == \
        janitor.Sweep(deleted=0, in_grace=2)
    assert broker.run(janitor.sweep_packs(c.meta, c.objects, NS, "pt", None, lanes, grace_s=0)) == \
        janitor.Sweep(deleted=1, in_grace=1)
    assert objects_of(broker, "pt") == sorted([*stored, pending])
    for p in range(PARTITIONS):
        assert read(broker, "pt", p) == [f"p{p}r{r}".encode() for r in range(ROUNDS)]
