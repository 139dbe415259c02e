"""A shard's housekeeping on a real broker. The janitor (kafscale/broker/janitor.py): uncommitted leftovers
below a partition's end go, nothing committed ever does (not even an upload whose commit is slow), and an
interrupted topic deletion is finished without touching a topic of the same name made since. Scheduled metadata
snapshots (kafscale/broker/snapshot.py): taken, and only the newest kept."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafscale.broker import janitor, retention
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
from tests.unit.test_partition_owner import FlakyMeta

pytestmark = pytest.mark.timeout(120)
NS = "default"


class HeldCommits(FlakyMeta):
    """Transactions wait while `gate` is clear: a commit cannot be made slow on demand otherwise."""

    async def close(self) -> None:
        await self.inner.close()


async def _gate(meta: FlakyMeta, open_: bool) -> None:
    """On the broker's loop: asyncio.Event is not for other threads."""
    if open_:
        meta.gate.set()
    else:
        meta.gate.clear()


@pytest.fixture
def broker(tmp_path: Path) -> Any:
    meta = HeldCommits(EmbeddedStore(tmp_path / "meta.db"))
    b = InProcessBroker(BrokerConfig(metrics_listen="", flush_interval_ms=10, janitor_interval_s=0),
                        meta=lambda: meta, objects=lambda: LocalDirStore(tmp_path / "objects"))
    with b:
        b.slow = meta  # type: ignore[attr-defined]
        b.objects = tmp_path / "objects"  # type: ignore[attr-defined]
        yield b


def core(b: InProcessBroker) -> ShardCore:
    assert b.shard is not None
    return b.shard.core


def produce(b: InProcessBroker, topic: str, values: list[bytes], partitions: int = 1) -> None:
    producer = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 0})
    for i, v in enumerate(values):
        producer.produce(topic, value=v, partition=i % partitions)
        producer.flush(10)  # one batch, one segment each
    assert producer.flush(30) == 0


def consume(b: InProcessBroker, topic: str, n: int) -> list[bytes]:
    return consume_from(b, topic, 0, n)


def create(b: InProcessBroker, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": b.bootstrap})  # held until the answer is in
    admin.create_topics([NewTopic(topic, 1)])[topic].result(15)


def stored(b: InProcessBroker, topic: str) -> set[str]:
    root = b.objects  # type: ignore[attr-defined]
    return {str(p.relative_to(root)) for p in (root / NS / topic).rglob("*") if p.is_file()}


def test_uncommitted_leftovers_below_the_end_go_after_the_grace_and_nothing_committed_does(
        broker: InProcessBroker) -> None:
    create(broker, "t")
    values = [f"v{i}".encode() for i in range(5)]
    produce(broker, "t", values)
    owner = core(broker).owners[("t", 0)]
    assert owner.high_watermark == 5 and len(owner.segments) == 5
    committed = stored(broker, "t")
    objects = core(broker).objects
    below = object_keys.segment_key(NS, "t", 0, 2, epoch=7)  # a dead owner's upload that never committed
    above = object_keys.segment_key(NS, "t", 0, 9)  # at or past the end: a commit may still be on its way
    foreign = f"{NS}/t/0/notes.txt"
    for key in (below, above, foreign):
        broker.run(objects.put(key, b"leftover"))

    assert broker.run(janitor.sweep_partition(owner, grace_s=3600)) == janitor.Sweep(deleted=0, in_grace=1)
    assert broker.run(janitor.sweep_partition(owner, grace_s=0)) == janitor.Sweep(deleted=1, in_grace=0)
    assert stored(broker, "t") == committed | {above, foreign}
    assert consume(broker, "t", 5) == values


def test_an_upload_whose_commit_is_slow_is_never_deleted(broker: InProcessBroker) -> None:
    create(broker, "slow")
    produce(broker, "slow", [b"first"])
    owner = core(broker).owners[("slow", 0)]
    before = stored(broker, "slow")
    broker.run(_gate(broker.slow, open_=False))  # type: ignore[attr-defined]
    attempts = broker.slow.txn_attempts  # type: ignore[attr-defined]
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    producer.produce("slow", value=b"second")
    producer.poll(0)
    deadline = time.monotonic() + 10
    while len(stored(broker, "slow")) == len(before):  # uploaded, its commit held back
        assert time.monotonic() < deadline, "the second segment was never uploaded"
        time.sleep(0.02)
    deadline = time.monotonic() + 10
    while broker.slow.txn_attempts == attempts:  # type: ignore[attr-defined]  # its commit is waiting
        assert time.monotonic() < deadline, "the second segment's commit never started"
        time.sleep(0.02)
    assert owner.high_watermark == 1
    assert broker.run(janitor.sweep_partition(owner, grace_s=0)).deleted == 0
    broker.run(_gate(broker.slow, open_=True))  # type: ignore[attr-defined]
    assert producer.flush(30) == 0
    assert consume(broker, "slow", 2) == [b"first", b"second"]


def test_an_interrupted_topic_deletion_is_finished_and_the_name_is_free_only_then(broker: InProcessBroker) -> None:
    c = core(broker)
    create(broker, "gone")
    produce(broker, "gone", [b"old-0", b"old-1", b"old-2"])
    assert broker.run(c.topics.delete("gone"))  # the metadata only: as if cut short before the objects
    left = stored(broker, "gone")
    assert left
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    with pytest.raises(Exception, match="marked for deletion"):  # its objects would mix with the new topic's
        admin.create_topics([NewTopic("gone", 1)])["gone"].result(15)

    assert broker.run(janitor.sweep_deleted_topics(c.meta, c.objects, NS)).deleted == 0  # a minute's leeway
    later = time.time() + janitor.TOMBSTONE_AGE_S
    assert broker.run(janitor.sweep_deleted_topics(c.meta, c.objects, NS, now=later)).deleted == len(left)
    assert stored(broker, "gone") == set()
    assert broker.run(c.meta.get(keys.deleted_topic("gone"))) is None
    create(broker, "gone")  # the name is free again
    produce(broker, "gone", [b"new-0"])
    assert consume(broker, "gone", 1) == [b"new-0"]
    assert broker.run(janitor.sweep_deleted_topics(c.meta, c.objects, NS, now=later)).deleted == 0


def test_deleting_a_topic_removes_its_objects_and_frees_its_name_at_once(broker: InProcessBroker) -> None:
    create(broker, "brief")
    produce(broker, "brief", [b"x", b"y"])
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.delete_topics(["brief"])["brief"].result(15)
    assert stored(broker, "brief") == set()
    assert broker.run(core(broker).meta.get(keys.deleted_topic("brief"))) is None
    create(broker, "brief")
    produce(broker, "brief", [b"z"])
    assert consume(broker, "brief", 1) == [b"z"]


def test_each_shard_sweeps_on_its_own_and_counts_what_it_deleted(tmp_path: Path) -> None:
    config = BrokerConfig(metrics_listen="", flush_interval_ms=10, janitor_interval_s=0.2, orphan_grace_s=0)
    with InProcessBroker(config, meta=lambda: EmbeddedStore(tmp_path / "meta.db"),
                         objects=lambda: LocalDirStore(tmp_path / "objects")) as b:
        b.objects = tmp_path / "objects"  # type: ignore[attr-defined]
        create(b, "swept")
        produce(b, "swept", [b"a", b"b"])
        leftover = object_keys.segment_key(NS, "swept", 0, 1, epoch=3)
        b.run(core(b).objects.put(leftover, b"leftover"))
        assert b.shard is not None
        deadline = time.monotonic() + 10
        while leftover in stored(b, "swept") or b.shard.metrics.orphans_deleted._value.get() < 1:
            assert time.monotonic() < deadline, "the janitor never swept, or did not count it"
            time.sleep(0.05)
        assert consume(b, "swept", 2) == [b"a", b"b"]


def test_scheduled_snapshots_are_taken_and_only_the_newest_kept(tmp_path: Path) -> None:
    config = BrokerConfig(metrics_listen="", metadata_snapshot_interval_s=0.2, metadata_snapshots_kept=2)
    with InProcessBroker(config, meta=lambda: EmbeddedStore(tmp_path / "meta.db"),
                         objects=lambda: LocalDirStore(tmp_path / "objects")) as b:
        create(b, "kept")
        assert b.shard is not None
        # Three rounds reported (each one reports after its prune): the third had two older ones to choose from.
        # Listed at once after a report, while the next round still sleeps its 0.2 s.
        seen: set[float] = set()
        deadline = time.monotonic() + 60
        while len(seen) < 3:
            assert time.monotonic() < deadline, f"{len(seen)} scheduled snapshots"
            time.sleep(0.01)
            if when := b.shard.metrics.snapshot_time._value.get():
                seen.add(when)
        taken = sorted(p.name for p in (tmp_path / "objects" / NS / "@metadata").iterdir())
        assert len(taken) == 2 and all(name.startswith("snapshot-") for name in taken)
        assert time.time() - b.shard.metrics.snapshot_time._value.get() < 5


def test_packs_no_commit_names_go_and_none_a_commit_may_still_name(broker: InProcessBroker) -> None:
    """A topic with virtual partitions (4 over 2 physical) stores packs. A pack goes once every lane it holds has
    dropped its segment from it, or never committed it and moved past it; one whose commit is on its way stays."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("vt", 2, config={"kafscale.virtual.partitions": "4"})])["vt"].result(15)
    produce(broker, "vt", [f"v{i}".encode() for i in range(8)], partitions=4)  # two segments per lane
    c = core(broker)
    files = stored(broker, "vt")
    assert files and all(f.rsplit("/", 2)[1] in ("0", "1") and f.endswith(".kfp") for f in files), files
    first = {f for f in files if f.startswith(f"{NS}/vt/0/")}

    # A pack a dead owner uploaded and never committed: lane 0's segment at base 0, which another pack holds.
    batch = record_batch(b"leftover")
    leftover = object_keys.pack_key(NS, "vt", object_keys.pack_name(0, uuid.uuid4().hex))
    broker.run(c.objects.put(leftover, build_pack([(0, 1, build_segment([batch], created_ms=1))], 2, 4).data))
    lanes = [0, 2]
    assert broker.run(janitor.sweep_packs(c.meta, c.objects, NS, "vt", 0, lanes, grace_s=3600)) == \
        janitor.Sweep(deleted=0, in_grace=1)
    assert broker.run(janitor.sweep_packs(c.meta, c.objects, NS, "vt", 0, lanes, grace_s=0)) == \
        janitor.Sweep(deleted=1, in_grace=0)
    assert stored(broker, "vt") == files, "only the leftover went"

    # Lanes 0 and 2 drop their first segment: retention deletes the packs that held only those at once (the
    # janitor finds nothing left to do); lanes 1 and 3 lose nothing.
    for lane in lanes:
        owner = c.owners[("vt", lane)]
        assert broker.run(retention.delete_records(owner, 1, c.owners)).error == 0
    assert stored(broker, "vt") < files
    assert broker.run(janitor.sweep_packs(c.meta, c.objects, NS, "vt", 0, lanes, grace_s=0)).deleted == 0
    assert all(f in stored(broker, "vt") for f in files - first), "physical partition 1's packs stay"
    for lane in (1, 3):
        assert consume_from(broker, "vt", lane, 2) == [f"v{lane}".encode(), f"v{lane + 4}".encode()]
    for lane in lanes:
        assert consume_from(broker, "vt", lane, 1, offset=1) == [f"v{lane + 4}".encode()]

    # Uploads past lane 2's end that no commit names: the current owner's (epoch 1) may still be committed, a
    # fenced earlier owner's (epoch 0) never will.
    end = c.owners[("vt", 2)].high_watermark
    current, fenced = (object_keys.pack_key(NS, "vt", object_keys.pack_name(0, uuid.uuid4().hex)) for _ in range(2))
    for key, epoch in ((current, 1), (fenced, 0)):
        late = record_batch(b"unacknowledged")
        set_base_offset(late, 0, end)
        broker.run(c.objects.put(key, build_pack([(2, epoch, build_segment([late], created_ms=1))], 2, 4).data))
    kept = stored(broker, "vt")
    assert broker.run(janitor.sweep_packs(c.meta, c.objects, NS, "vt", 0, lanes, grace_s=0)).deleted == 1
    assert stored(broker, "vt") == kept - {fenced}, "only the fenced writer's"
    broker.run(c.objects.delete(current))

    # A pack whose commit is held back: uploaded, not yet named, and past lane 0's committed end.
    before = stored(broker, "vt")
    broker.run(_gate(broker.slow, open_=False))  # type: ignore[attr-defined]
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    producer.produce("vt", value=b"late", partition=0)
    producer.poll(0)
    deadline = time.monotonic() + 10
    while stored(broker, "vt") == before:
        assert time.monotonic() < deadline, "the pack was never uploaded"
        time.sleep(0.02)
    assert broker.run(janitor.sweep_packs(c.meta, c.objects, NS, "vt", 0, lanes, grace_s=0)).deleted == 0
    broker.run(_gate(broker.slow, open_=True))  # type: ignore[attr-defined]
    assert producer.flush(30) == 0
    assert consume_from(broker, "vt", 0, 1, offset=2) == [b"late"]


def consume_from(b: InProcessBroker, topic: str, partition: int, n: int, offset: int = 0) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": b.bootstrap, "group.id": f"g-{time.monotonic()}"})
    consumer.assign([TopicPartition(topic, partition, offset)])
    got: list[bytes] = []
    deadline = time.monotonic() + 20
    try:
        while len(got) < n and time.monotonic() < deadline:
            got += [m.value() for m in consumer.consume(100, 0.5) if m.error() is None]
    finally:
        consumer.close()
    return got
