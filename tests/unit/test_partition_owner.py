"""PartitionOwner driven directly: offsets, group commit, visibility, recovery, fencing, idempotence, faults.

Owners run against real stores (EmbeddedStore + a local directory; real etcd + moto S3 where the point
is the real components: those tests are in tests/integration/test_partition_owner_fencing.py). Faults are
injected by thin wrappers around those stores, because an outage at an exact moment cannot be produced
otherwise deterministically.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kio.schema.errors import ErrorCode

from kafscale.broker.partition_owner import AppendOutcome, OwnerSettings, PartitionError, PartitionOwner
from kafscale.cluster import keys
from kafscale.cluster.records import SegmentMeta
from kafscale.storage import keys as object_keys
from kafscale.storage.async_store import AsyncObjectStore
from kafscale.storage.batch import check_crc, split_batches
from kafscale.storage.cache import ByteLRU
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.health import HealthState, HealthThresholds, HealthTracker
from kafscale.storage.local_store import LocalDirStore
from kafscale.storage.metadata_store import Compare, KeyValue, MetadataStore, MetadataStoreError, Op, TxnResult
from kafscale.storage.object_store import ObjectInfo, ObjectStore, ObjectStoreError
from kafscale.storage.segment import SEGMENT_FOOTER_SIZE, SEGMENT_HEADER_SIZE, SegmentReader, build_segment

TOPIC = "orders"
NS = "default"
INT32_MAX = 2**31 - 1


# ---------------------------------------------------------------- helpers (test_read_path.py uses them too)


def batch(
    values: Sequence[bytes],
    *,
    pid: int = -1,
    epoch: int = -1,
    seq: int = -1,
    ts: int | Sequence[int] = 1_000,
    codec: int = 0,
) -> bytes:
    """One v2 record batch built by aiokafka (an independent implementation of the format)."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=0, producer_id=pid, producer_epoch=epoch,
        base_sequence=seq, batch_size=1 << 30,
    )
    for i, value in enumerate(values):
        stamp = ts if isinstance(ts, int) else ts[i]
        assert builder.append(i, timestamp=stamp, key=None, value=value, headers=[]) is not None
    return bytes(builder.build())


def records_of(data: bytes | memoryview) -> list[tuple[int, bytes]]:
    """(offset, value) of every record in concatenated batches."""
    out: list[tuple[int, bytes]] = []
    for pos, header in split_batches(data, verify_crc=True):
        for record in DefaultRecordBatch(bytes(data[pos : pos + header.size])):
            out.append((record.offset, bytes(record.value)))
    return out


def values(n: int, prefix: str = "v", size: int = 0) -> list[bytes]:
    return [f"{prefix}{i}".encode().ljust(size, b".") for i in range(n)]


async def eventually(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.005)


async def durable(outcome: AppendOutcome, timeout: float = 10.0) -> None:
    """The append was accepted and its records are now committed."""
    assert outcome.error == ErrorCode.none, outcome
    assert outcome.durable is not None
    await asyncio.wait_for(asyncio.shield(outcome.durable), timeout)


async def retry_answered(outcome: AppendOutcome, base_offset: int) -> None:
    """A retried batch was answered with its original offsets (a retry of committed data has nothing to wait
    for; one of still-buffered data waits for the original's commit)."""
    assert outcome.error == ErrorCode.none, outcome
    assert outcome.base_offset == base_offset
    if outcome.durable is not None:
        await asyncio.wait_for(asyncio.shield(outcome.durable), 10)


async def read_all(owner: PartitionOwner, max_bytes: int = 1 << 20) -> list[tuple[int, bytes]]:
    """Every committed record, read through the owner's read path from its log start to its high watermark."""
    out: list[tuple[int, bytes]] = []
    offset = owner.log_start_offset
    while offset < owner.high_watermark:
        recs = [r for r in records_of(await owner.reader.read(offset, max_bytes)) if r[0] >= offset]
        assert recs, f"read at {offset} returned nothing below the high watermark {owner.high_watermark}"
        out += recs
        offset = recs[-1][0] + 1
    return out


def stored_segments(store: ObjectStore, topic: str = TOPIC, partition: int = 0) -> dict[int, SegmentReader]:
    """Every segment object of the partition, fully verified (header, batch CRCs, footer CRC)."""
    out: dict[int, SegmentReader] = {}
    for info in store.list(object_keys.partition_prefix(NS, topic, partition)):
        parsed = object_keys.parse_segment_key(info.key)
        if parsed is not None and parsed.kind == "kfs":
            out[parsed.base_offset] = SegmentReader(store.get(info.key), key=info.key, verify=True)
    return out


async def stored_records(env: Env) -> list[tuple[int, bytes]]:
    """Every record of the committed segments, read straight from the object keys their commits name."""
    out: list[tuple[int, bytes]] = []
    for kv in await env.meta.range(keys.segments(TOPIC, 0)):
        meta = SegmentMeta.from_value(kv.value)
        key = object_keys.segment_key(NS, TOPIC, 0, meta.base, meta.key_epoch)
        reader = SegmentReader(env.store.get(key), key=key, verify=True)
        for pos, header in reader.batches():
            out += records_of(reader.batch_bytes(pos, header))
    return out


def segment_object_key(base: int) -> str:
    return object_keys.segment_key(NS, TOPIC, 0, base)


class FlakyObjects(ObjectStore):
    """An ObjectStore that counts calls, holds them while `gate` is clear, and fails them with
    ObjectStoreError while `failing`. Calls run on the async store's threads, hence a threading.Event."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.gate.set()
        self.failing = False
        self.failures = 0
        self.calls: Counter[str] = Counter()
        self.keys: list[tuple[str, str]] = []  # (operation, key) of every call
        self.deleted: list[str] = []

    def _enter(self, op: str, key: str) -> None:
        self.calls[op] += 1
        self.keys.append((op, key))
        assert self.gate.wait(timeout=30), "gate left closed"
        if self.failing:
            self.failures += 1
            raise ObjectStoreError(f"injected outage ({op})")

    def put(self, key: str, data: bytes) -> None:
        self._enter("put", key)
        self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self._enter("put_if_absent", key)
        return self.inner.put_if_absent(key, data)

    def get(self, key: str) -> bytes:
        self._enter("get", key)
        return self.inner.get(key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self._enter("get_range", key)
        return self.inner.get_range(key, start, length)

    def head(self, key: str) -> ObjectInfo | None:
        self._enter("head", key)
        return self.inner.head(key)

    def list(self, prefix: str, start_after: str = "", page_size: int = 1000) -> Iterator[ObjectInfo]:
        self._enter("list", prefix)
        return self.inner.list(prefix, start_after, page_size)

    def delete(self, key: str) -> None:
        self._enter("delete", key)
        self.deleted.append(key)
        self.inner.delete(key)


class FlakyMeta(MetadataStore):
    """A MetadataStore wrapper: holds transactions at a gate, fails them before or after applying them."""

    def __init__(self, inner: MetadataStore) -> None:
        self.inner = inner
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_txn_before = 0  # raise without applying, this many times
        self.fail_txn_after = 0  # apply, then raise as if the reply was lost, this many times
        self.fail_get = 0
        self.txn_attempts = 0
        self.txns_applied = 0

    async def txn(self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()) -> TxnResult:
        """How a transaction fails is decided when it arrives, before it waits at the gate."""
        self.txn_attempts += 1
        fail_before, fail_after = self.fail_txn_before > 0, self.fail_txn_after > 0
        self.fail_txn_before -= fail_before
        self.fail_txn_after -= fail_after
        await self.gate.wait()
        if fail_before:
            raise MetadataStoreError("injected: transaction not applied")
        result = await self.inner.txn(compares, success, failure)
        self.txns_applied += int(result.succeeded)
        if fail_after:
            raise MetadataStoreError("injected: transaction applied, reply lost")
        return result

    async def get(self, key: str) -> KeyValue | None:
        if self.fail_get > 0:
            self.fail_get -= 1
            raise MetadataStoreError("injected: get failed")
        return await self.inner.get(key)

    async def range(self, prefix: str) -> list[KeyValue]:
        return await self.inner.range(prefix)

    async def put(self, key: str, value: Any, lease: int = 0) -> int:
        return await self.inner.put(key, value, lease)

    async def delete(self, key: str, prefix: bool = False) -> int:
        return await self.inner.delete(key, prefix)

    async def revision(self) -> int:
        return await self.inner.revision()

    async def lease_grant(self, ttl_seconds: float) -> int:
        return await self.inner.lease_grant(ttl_seconds)

    async def lease_keepalive(self, lease_id: int) -> bool:
        return await self.inner.lease_keepalive(lease_id)

    async def lease_revoke(self, lease_id: int) -> None:
        await self.inner.lease_revoke(lease_id)

    def watch(self, prefix: str, start_revision: int = 0) -> AsyncIterator[Any]:
        return self.inner.watch(prefix, start_revision)

    async def close(self) -> None:
        """The wrapped store belongs to the test's fixture."""


class Env:
    """One partition's stores, and the owners a test opens on them (each with its own fresh cache, as a
    new process would have, unless given one)."""

    def __init__(self, meta: MetadataStore, store: ObjectStore) -> None:
        self.meta = meta
        self.store = store
        self.objects = AsyncObjectStore(store)
        self.owners: list[PartitionOwner] = []
        self._extra: list[AsyncObjectStore] = []

    def async_objects(self, store: ObjectStore, health: HealthTracker | None = None) -> AsyncObjectStore:
        wrapped = AsyncObjectStore(store, health=health)
        self._extra.append(wrapped)
        return wrapped

    async def owner(
        self,
        *,
        meta: MetadataStore | None = None,
        objects: AsyncObjectStore | None = None,
        cache: ByteLRU | None = None,
        **settings: Any,
    ) -> PartitionOwner:
        settings.setdefault("flush_interval_ms", 20)
        owner = PartitionOwner(
            TOPIC, 0, shard_id=len(self.owners), meta=meta or self.meta, objects=objects or self.objects,
            cache=cache or ByteLRU(64 << 20), settings=OwnerSettings(namespace=NS, **settings),
        )
        await owner.open()
        self.owners.append(owner)
        return owner

    async def aclose(self) -> None:
        for owner in self.owners:
            await owner.close(flush=False)
        for objects in [self.objects, *self._extra]:
            objects.close()


# ---------------------------------------------------------------- offsets


async def test_offsets_contiguous_across_batches_requests_and_segments(env: Env) -> None:
    owner = await env.owner()
    # One request carrying several batches, a second request in the same flush window, and a third
    # after the first segment committed (so it lands in a second segment).
    first = await owner.append(batch(values(2, "a")) + batch(values(3, "b"), codec=1) + batch(values(1, "c")), acks=-1)
    second = await owner.append(batch(values(4, "d"), codec=3), acks=-1)
    await durable(first)
    await durable(second)
    third = await owner.append(batch(values(2, "e"), codec=4), acks=-1)
    await durable(third)

    assert (first.base_offset, second.base_offset, third.base_offset) == (0, 6, 10)
    assert owner.high_watermark == owner.next_offset == 12
    assert [(s.base, s.last) for s in owner.segments] == [(0, 9), (10, 11)]

    segments = stored_segments(env.store)
    assert sorted(segments) == [0, 10]
    bases = []
    for reader in segments.values():
        for pos, header in reader.batches():
            check_crc(reader.batch_bytes(pos, header), 0, header)  # the patched base offset kept the CRC valid
            bases.append(header.base_offset)
    assert sorted(bases) == [0, 2, 5, 6, 10]
    expected_values = values(2, "a") + values(3, "b") + values(1, "c") + values(4, "d") + values(2, "e")
    assert (await stored_records(env)) == list(enumerate(expected_values))
    assert await read_all(owner) == list(enumerate(expected_values))


# ---------------------------------------------------------------- group commit


async def test_appends_within_one_flush_window_share_one_segment(env: Env) -> None:
    owner = await env.owner(flush_interval_ms=300)
    outcomes = [await owner.append(batch([f"r{i}".encode()]), acks=-1) for i in range(50)]
    await asyncio.gather(*(durable(o) for o in outcomes))

    assert [o.base_offset for o in outcomes] == list(range(50))
    assert [(s.base, s.last) for s in owner.segments] == [(0, 49)]
    assert len(await env.meta.range(keys.segments(TOPIC, 0))) == 1
    assert sorted(info.key for info in env.store.list(f"{NS}/{TOPIC}/0/")) == [
        object_keys.index_key(NS, TOPIC, 0, 0), segment_object_key(0)]


async def test_timer_flushes_without_further_appends(env: Env) -> None:
    owner = await env.owner(flush_interval_ms=30)
    started = time.monotonic()
    outcome = await owner.append(batch(values(3)), acks=-1)
    await durable(outcome, timeout=5)  # nothing else happens: only the timer can have flushed
    assert time.monotonic() - started >= 0.03
    assert owner.high_watermark == 3
    assert sorted(stored_segments(env.store)) == [0]


PID = 4242  # an idempotent producer of the flush_now tests


async def test_flush_now_seals_the_open_window_without_waiting_for_the_interval(env: Env) -> None:
    """Its producers are blocked on their answers (kafscale.acceptor.blocked_producers): the window seals at once,
    whole, and later appends start a window that waits for the interval again."""
    owner = await env.owner(flush_interval_ms=600_000, blocked_flush_min_bytes=0)  # the timer never fires here
    first = [await owner.append(batch(values(3), pid=PID, epoch=0, seq=3 * i), acks=-1) for i in range(2)]
    owner.flush_now(PID + 1)  # another producer: none of its records wait here
    await asyncio.sleep(0.3)
    assert owner.high_watermark == 0
    owner.flush_now(PID)
    await asyncio.gather(*(durable(o, timeout=5) for o in first))
    assert [(s.base, s.last) for s in owner.segments] == [(0, 5)]
    later = await owner.append(batch(values(2)), acks=-1)  # not idempotent: only the timer seals it
    owner.flush_now(PID)  # that producer's records are committed: the open window is someone else's
    await asyncio.sleep(0.3)
    assert not later.durable.done() and owner.high_watermark == 6


async def test_flush_now_of_a_plain_producer_seals_a_window_that_holds_plain_records(env: Env) -> None:
    """Plain records carry no producer id: a blocked plain producer (-1) seals the window if any plain records are
    in it, and leaves one holding only an idempotent producer's."""
    owner = await env.owner(flush_interval_ms=600_000, blocked_flush_min_bytes=0)  # the timer never fires here
    idempotent = await owner.append(batch(values(2), pid=PID, epoch=0, seq=0), acks=-1)
    owner.flush_now(-1)
    await asyncio.sleep(0.3)
    assert not idempotent.durable.done() and owner.high_watermark == 0
    plain = await owner.append(batch(values(3)), acks=-1)
    owner.flush_now(-1)
    await asyncio.gather(durable(idempotent, timeout=5), durable(plain, timeout=5))
    assert [(s.base, s.last) for s in owner.segments] == [(0, 4)]


async def test_flush_now_waits_for_the_interval_until_the_window_holds_blocked_flush_min_bytes(env: Env) -> None:
    """A slow producer's small window keeps the timer, so its records still share objects; once the window holds
    the minimum (more producers, or bigger batches) it seals."""
    owner = await env.owner(flush_interval_ms=600_000, blocked_flush_min_bytes=10_000)
    small = await owner.append(batch(values(3), pid=PID, epoch=0, seq=0), acks=-1)
    owner.flush_now(PID)
    await asyncio.sleep(0.3)
    assert not small.durable.done()
    large = await owner.append(batch(values(3, size=4000)), acks=-1)  # the window passes 10,000 bytes
    await asyncio.gather(durable(small, timeout=5), durable(large, timeout=5))
    assert [(s.base, s.last) for s in owner.segments] == [(0, 5)]


async def test_segments_roll_before_they_would_exceed_segment_bytes_and_close_flushes_the_tail(env: Env) -> None:
    """As Kafka rolls a log segment: the append that would take the open segment past segment.bytes goes
    into a new one, so stored objects stay within the limit; a single larger request gets a segment alone."""
    owner = await env.owner(segment_bytes=4096, flush_interval_ms=600_000)  # the timer never fires here
    record = batch(values(1, "big", 1000))
    per_segment = (4096 - SEGMENT_HEADER_SIZE - SEGMENT_FOOTER_SIZE) // len(record)
    outcomes = [await owner.append(batch(values(1, f"big{i}-", 1000)), acks=-1) for i in range(per_segment + 1)]
    await durable(outcomes[0], timeout=5)
    assert [(s.base, s.last) for s in owner.segments] == [(0, per_segment - 1)]
    assert owner.segments[0].size <= 4096
    assert outcomes[-1].durable is not None and not outcomes[-1].durable.done()  # rolled into the open one

    huge = await owner.append(batch(values(1, "huge", 5000)), acks=-1)  # alone larger than segment.bytes
    await durable(huge, timeout=5)
    assert [(s.base, s.last) for s in owner.segments] == [(0, per_segment - 1), (per_segment, per_segment),
                                                          (per_segment + 1, per_segment + 1)]
    assert owner.segments[2].size > 4096
    assert sorted(stored_segments(env.store)) == [0, per_segment, per_segment + 1]

    tail = await owner.append(batch(values(2, "tail")), acks=-1)
    await asyncio.sleep(0.1)  # a negative check: give a wrong flush the chance to happen
    assert tail.durable is not None and not tail.durable.done()
    assert owner.high_watermark == per_segment + 2

    await owner.close()
    assert tail.durable.done() and tail.durable.exception() is None
    successor = await env.owner()
    assert successor.high_watermark == per_segment + 4
    assert [(s.base, s.last) for s in successor.segments][-1] == (per_segment + 2, per_segment + 3)


class HeldKey(FlakyObjects):
    """Holds the conditional create of one key until released; every other call goes straight through."""

    def __init__(self, inner: ObjectStore, key: str) -> None:
        super().__init__(inner)
        self.held_key = key
        self.release = threading.Event()

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self._enter("put_if_absent", key)
        if key == self.held_key:
            assert self.release.wait(timeout=30), "held upload never released"
        return self.inner.put_if_absent(key, data)


@pytest.mark.parametrize("in_flight", [1, 4])
async def test_segments_upload_in_parallel_and_commit_in_offset_order(env: Env, in_flight: int) -> None:
    """The oldest segment's upload is slow: later segments upload meanwhile (up to the in-flight limit), but
    nothing is committed, visible or acknowledged before it; then everything ready commits in one txn."""
    store = HeldKey(env.store, segment_object_key(0))
    meta = FlakyMeta(env.meta)
    owner = await env.owner(meta=meta, objects=env.async_objects(store), segment_bytes=1000,
                            flush_interval_ms=600_000, uploads_in_flight=in_flight)
    outcomes = [await owner.append(batch(values(1, f"s{i}-", 1000)), acks=-1) for i in range(4)]  # 4 segments
    assert [o.base_offset for o in outcomes] == [0, 1, 2, 3]
    later = [segment_object_key(base) for base in (1, 2, 3)][: in_flight - 1]
    await eventually(lambda: all(env.store.head(k) is not None for k in later), "later segments uploaded")
    await asyncio.sleep(0.1)  # a negative check: give a wrong commit the chance to happen
    uploaded = {k for op, k in store.keys if op == "put_if_absent" and k.endswith(".kfs")}
    assert uploaded == {segment_object_key(0), *later}, "the in-flight limit was not respected"
    commits_before = meta.txns_applied
    assert owner.high_watermark == 0 and not any(o.durable is not None and o.durable.done() for o in outcomes)
    assert await env.meta.range(keys.segments(TOPIC, 0)) == []

    store.release.set()
    for outcome in outcomes:
        await durable(outcome)
    assert owner.high_watermark == 4
    assert [(s.base, s.last) for s in owner.segments] == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert await read_all(owner) == [(i, f"s{i}-0".encode().ljust(1000, b".")) for i in range(4)]
    assert await stored_records(env) == await read_all(owner)
    if in_flight == 4:  # all four were uploaded when the oldest landed: one transaction commits them
        assert meta.txns_applied - commits_before == 1


async def test_the_timer_does_not_seal_while_an_upload_is_running(env: Env) -> None:
    """When the store is slow, records keep filling the open segment instead of queueing one small object per
    flush interval; it is sealed as soon as the upload before it lands."""
    store = HeldKey(env.store, segment_object_key(0))
    owner = await env.owner(objects=env.async_objects(store), flush_interval_ms=30, uploads_in_flight=4)
    first = await owner.append(batch(values(1, "first")), acks=-1)
    await eventually(lambda: ("put_if_absent", segment_object_key(0)) in store.keys, "first segment uploading")
    later = []
    for i in range(4):  # each wait is longer than the flush interval
        later.append(await owner.append(batch(values(1, f"later{i}")), acks=-1))
        await asyncio.sleep(0.05)
    uploads = [k for op, k in store.keys if op == "put_if_absent" and k.endswith(".kfs")]
    assert uploads == [segment_object_key(0)], "the timer sealed segments behind a running upload"

    store.release.set()
    for outcome in [first, *later]:
        await durable(outcome)
    assert [(s.base, s.last) for s in owner.segments] == [(0, 0), (1, 4)]
    assert await stored_records(env) == await read_all(owner)


# ---------------------------------------------------------------- visibility


async def test_records_are_invisible_and_unacknowledged_until_their_segment_commits(env: Env) -> None:
    flaky = FlakyMeta(env.meta)
    owner = await env.owner(meta=flaky)
    flaky.gate.clear()  # commits wait here
    outcome = await owner.append(batch(values(3)), acks=-1)
    assert outcome.durable is not None
    committed_when_acked: list[int] = []
    outcome.durable.add_done_callback(lambda _f: committed_when_acked.append(flaky.txns_applied))

    await eventually(lambda: flaky.txn_attempts == 2, "the commit to reach the metadata store")  # open + commit
    assert segment_object_key(0) in [i.key for i in env.store.list(f"{NS}/{TOPIC}/0/")]  # uploaded already
    assert owner.high_watermark == 0
    assert owner.segments == [] and owner.segment_for(0) is None
    assert await owner.reader.read(0, 1 << 20) == b""
    assert await owner.reader.offset_for_timestamp(0) is None
    assert not outcome.durable.done()
    assert await env.meta.get(keys.state(TOPIC, 0)) is None

    flaky.gate.set()
    await durable(outcome)
    assert committed_when_acked == [2]  # the owner-key CAS of open(), then this segment's commit
    assert owner.high_watermark == 3
    assert await read_all(owner) == list(enumerate(values(3)))


# ---------------------------------------------------------------- recovery


async def test_new_owner_resumes_at_committed_watermark_with_producer_state(env: Env) -> None:
    flaky = FlakyMeta(env.meta)
    first = await env.owner(meta=flaky)
    b0 = batch(values(3, "a"), pid=7, epoch=0, seq=0)
    b1 = batch(values(2, "b"), pid=7, epoch=0, seq=3)
    await durable(await first.append(b0, acks=-1))
    await durable(await first.append(b1, acks=-1))
    flaky.gate.clear()
    lost = await first.append(batch(values(1, "lost"), pid=7, epoch=0, seq=5), acks=-1)
    await eventually(lambda: flaky.txn_attempts == 4, "the last commit to be held")
    await first.close(flush=False)  # dies before that commit
    assert lost.durable is not None and isinstance(lost.durable.exception(), PartitionError)

    second = await env.owner()
    assert second.epoch == first.epoch + 1
    assert second.high_watermark == second.next_offset == 5
    assert await read_all(second) == list(enumerate(values(3, "a") + values(2, "b")))
    for retried, original in ((b0, 0), (b1, 3)):  # retries from before the restart
        await retry_answered(await second.append(retried, acks=-1), original)
    # The producer resends the batch that was lost; it follows on and takes the next offset.
    resent = await second.append(batch(values(1, "lost"), pid=7, epoch=0, seq=5), acks=-1)
    await durable(resent)
    assert resent.base_offset == 5
    assert await read_all(second) == list(enumerate(values(3, "a") + values(2, "b") + values(1, "lost")))
    assert (await stored_records(env)) == list(enumerate(values(3, "a") + values(2, "b") + values(1, "lost")))


async def test_committed_producer_state_holds_only_committed_batches(env: Env) -> None:
    """A segment's commit persists the producer state as of its own last batch, not batches buffered
    after it: a successor would otherwise answer a retry of an uncommitted batch with offsets that were
    never written."""
    flaky = FlakyMeta(env.meta)
    flaky_objects = FlakyObjects(env.store)
    first = await env.owner(meta=flaky, objects=env.async_objects(flaky_objects))
    flaky_objects.gate.clear()
    held = await first.append(batch(values(2, "a"), pid=9, epoch=0, seq=0), acks=-1)
    await eventually(lambda: flaky_objects.calls["put_if_absent"] > 0, "the first upload to be held")
    buffered = await first.append(batch(values(2, "b"), pid=9, epoch=0, seq=2), acks=-1)
    flaky.gate.clear()
    flaky_objects.gate.set()
    await eventually(lambda: flaky.txn_attempts == 2, "the first commit to arrive")  # open() made the first
    flaky.fail_txn_before = 1_000  # it goes through; every later commit fails
    flaky.gate.set()
    await durable(held)
    await eventually(lambda: flaky.txn_attempts >= 4, "the second commit to fail")
    await first.close(flush=False)
    assert buffered.durable is not None and isinstance(buffered.durable.exception(), PartitionError)

    stored = await env.meta.get(keys.producer(TOPIC, 0, 9))
    assert stored is not None and stored.value["batches"] == [[0, 1, 0, 1]]
    second = await env.owner()
    assert second.high_watermark == 2
    retry = await second.append(batch(values(2, "b"), pid=9, epoch=0, seq=2), acks=-1)
    await durable(retry)
    assert second.high_watermark == 4  # written now, not mistaken for a duplicate
    assert await read_all(second) == list(enumerate(values(2, "a") + values(2, "b")))


# ---------------------------------------------------------------- uncommitted objects


async def test_uploaded_but_uncommitted_segment_is_never_served_nor_deleted(env: Env) -> None:
    flaky_objects = FlakyObjects(env.store)
    objects = env.async_objects(flaky_objects)
    first = await env.owner(objects=objects)
    await durable(await first.append(batch(values(3, "ok")), acks=-1))
    await first.close()
    # An owner that uploaded the next segment and died before committing it.
    ghost = bytearray(batch(values(2, "ghost"), ts=5_000))
    ghost[0:8] = (3).to_bytes(8, "big")
    built = build_segment([ghost], created_ms=1)
    env.store.put(segment_object_key(3), built.data)
    env.store.put(object_keys.index_key(NS, TOPIC, 0, 3), built.index)

    second = await env.owner(objects=objects)
    assert second.high_watermark == 3
    assert second.segment_for(3) is None
    assert await read_all(second) == list(enumerate(values(3, "ok")))
    assert await second.reader.offset_for_timestamp(5_000) is None

    outcome = await second.append(batch(values(1, "real")), acks=-1)
    await durable(outcome)
    assert outcome.base_offset == 3
    # The leftover stays (deleting it could race with a successor); this epoch wrote its own keys.
    assert not flaky_objects.deleted
    assert env.store.get(segment_object_key(3)) == built.data
    assert second.segment_for(3).key_epoch == second.epoch
    assert env.store.get(object_keys.segment_key(NS, TOPIC, 0, 3, second.epoch))
    assert (await stored_records(env)) == list(enumerate(values(3, "ok") + values(1, "real")))
    assert await read_all(second) == list(enumerate(values(3, "ok") + values(1, "real")))


async def test_owner_dying_before_its_commit_leaves_nothing_a_successor_serves(env: Env) -> None:
    flaky = FlakyMeta(env.meta)
    first = await env.owner(meta=flaky)
    flaky.fail_txn_before = 1_000
    doomed = await first.append(batch(values(2, "doomed")), acks=-1)
    await eventually(lambda: flaky.txn_attempts >= 3, "commits to fail")
    assert segment_object_key(0) in [i.key for i in env.store.list(f"{NS}/{TOPIC}/0/")]
    await first.close(flush=False)
    assert doomed.durable is not None and isinstance(doomed.durable.exception(), PartitionError)

    second = await env.owner()
    assert second.high_watermark == 0 and second.segments == []
    assert await second.reader.read(0, 1 << 20) == b""
    outcome = await second.append(batch(values(1, "fresh")), acks=-1)
    await durable(outcome)
    assert outcome.base_offset == 0
    assert (await stored_records(env)) == [(0, b"fresh0")]
    assert await read_all(second) == [(0, b"fresh0")]


# ---------------------------------------------------------------- idempotence


async def test_idempotent_retries_of_the_last_five_batches_get_their_original_offsets(env: Env) -> None:
    owner = await env.owner()
    sent = [batch(values(2, f"s{i}-"), pid=11, epoch=0, seq=2 * i) for i in range(6)]
    outcomes = [await owner.append(b, acks=-1) for b in sent]
    for outcome in outcomes:
        await durable(outcome)
    assert [o.base_offset for o in outcomes] == [0, 2, 4, 6, 8, 10]

    for b, original in zip(sent[1:], outcomes[1:], strict=True):
        await retry_answered(await owner.append(b, acks=-1), original.base_offset)
    # Kafka keeps five batches per producer: the sixth-newest is no longer recognised.
    assert (await owner.append(sent[0], acks=-1)).error == ErrorCode.out_of_order_sequence_number
    assert owner.high_watermark == owner.next_offset == 12  # no retry took an offset
    assert len(await stored_records(env)) == 12


async def test_retry_of_a_still_buffered_batch_resolves_with_the_original(env: Env) -> None:
    flaky = FlakyMeta(env.meta)
    owner = await env.owner(meta=flaky)
    flaky.gate.clear()
    b = batch(values(2), pid=12, epoch=0, seq=0)
    original = await owner.append(b, acks=-1)
    retry = await owner.append(b, acks=-1)
    assert retry.base_offset == original.base_offset == 0
    assert retry.durable is not None and not retry.durable.done()
    flaky.gate.set()
    await retry_answered(retry, 0)
    assert original.durable is not None and original.durable.done()
    assert owner.high_watermark == 2 and len(await stored_records(env)) == 2


async def test_sequence_gap_stale_epoch_and_new_epoch_rules(env: Env) -> None:
    owner = await env.owner()
    await durable(await owner.append(batch(values(2), pid=13, epoch=3, seq=0), acks=-1))
    gap = await owner.append(batch(values(1), pid=13, epoch=3, seq=3), acks=-1)
    assert gap.error == ErrorCode.out_of_order_sequence_number and gap.durable is None
    stale = await owner.append(batch(values(1), pid=13, epoch=2, seq=2), acks=-1)
    assert stale.error == ErrorCode.invalid_producer_epoch
    bumped_mid_sequence = await owner.append(batch(values(1), pid=13, epoch=4, seq=2), acks=-1)
    assert bumped_mid_sequence.error == ErrorCode.out_of_order_sequence_number
    bumped = await owner.append(batch(values(1, "new"), pid=13, epoch=4, seq=0), acks=-1)
    await durable(bumped)
    assert bumped.base_offset == 2
    old_epoch = await owner.append(batch(values(1), pid=13, epoch=3, seq=2), acks=-1)
    assert old_epoch.error == ErrorCode.invalid_producer_epoch
    assert owner.high_watermark == owner.next_offset == 3


async def test_sequence_wraps_after_int32_max(env: Env) -> None:
    owner = await env.owner()
    outcomes = [
        await owner.append(batch(values(2), pid=14, epoch=0, seq=INT32_MAX - 1), acks=-1),  # ends at INT32_MAX
        await owner.append(batch(values(3), pid=14, epoch=0, seq=0), acks=-1),
    ]
    for outcome in outcomes:
        await durable(outcome)
    spanning = await owner.append(batch(values(3), pid=15, epoch=0, seq=INT32_MAX - 1), acks=-1)  # ..., MAX, 0
    await durable(spanning)
    after = await owner.append(batch(values(1), pid=15, epoch=0, seq=1), acks=-1)
    await durable(after)
    assert (await owner.append(batch(values(1), pid=14, epoch=0, seq=INT32_MAX), acks=-1)).error == (
        ErrorCode.out_of_order_sequence_number)
    await retry_answered(await owner.append(batch(values(3), pid=15, epoch=0, seq=INT32_MAX - 1), acks=-1),
                         spanning.base_offset)
    assert owner.high_watermark == owner.next_offset == 9


async def test_several_batches_of_one_producer_in_one_request(env: Env) -> None:
    owner = await env.owner()
    request = (batch(values(2, "x"), pid=16, epoch=0, seq=0) + batch(values(1, "y"), pid=16, epoch=0, seq=2)
               + batch(values(3, "z"), pid=16, epoch=0, seq=3))
    outcome = await owner.append(request, acks=-1)
    await durable(outcome)
    assert outcome.base_offset == 0 and owner.high_watermark == 6

    await retry_answered(await owner.append(request, acks=-1), 0)
    broken = batch(values(1), pid=16, epoch=0, seq=6) + batch(values(1), pid=16, epoch=0, seq=8)
    assert (await owner.append(broken, acks=-1)).error == ErrorCode.out_of_order_sequence_number
    assert owner.next_offset == owner.high_watermark == 6  # neither the retry nor the refused request took one
    assert (await stored_records(env)) == list(enumerate(values(2, "x") + values(1, "y") + values(3, "z")))


# ---------------------------------------------------------------- faults


async def test_object_store_outage_holds_acknowledgements_until_the_data_is_stored(env: Env) -> None:
    flaky_objects = FlakyObjects(env.store)
    owner = await env.owner(objects=env.async_objects(flaky_objects))
    flaky_objects.failing = True
    outcome = await owner.append(batch(values(3)), acks=-1)
    await eventually(lambda: flaky_objects.failures >= 4, "flush attempts to fail")
    assert outcome.durable is not None and not outcome.durable.done()
    assert owner.high_watermark == 0 and await env.meta.get(keys.state(TOPIC, 0)) is None

    flaky_objects.failing = False
    await durable(outcome, timeout=10)
    assert owner.high_watermark == 3
    assert (await stored_records(env)) == list(enumerate(values(3)))
    assert await read_all(await env.owner()) == list(enumerate(values(3)))


async def test_health_gating_answers_storage_error_while_the_store_fails(env: Env) -> None:
    flaky_objects = FlakyObjects(env.store)
    health = HealthTracker(HealthThresholds(window_s=0.5))
    owner = await env.owner(objects=env.async_objects(flaky_objects, health))
    flaky_objects.failing = True
    accepted = await owner.append(batch(values(1, "before")), acks=-1)
    await eventually(lambda: health.state() != HealthState.HEALTHY, "the store to be judged unhealthy")
    refused = await owner.append(batch(values(1, "during")), acks=-1)
    assert refused.error == ErrorCode.kafka_storage_error and refused.durable is None

    flaky_objects.failing = False
    await durable(accepted)
    await eventually(lambda: health.state() == HealthState.HEALTHY, "the failures to age out")
    after = await owner.append(batch(values(1, "after")), acks=-1)
    await durable(after)
    assert await read_all(owner) == [(0, b"before0"), (1, b"after0")]


async def test_close_during_an_outage_gives_up_and_fails_the_waiters(env: Env) -> None:
    flaky_objects = FlakyObjects(env.store)
    owner = await env.owner(objects=env.async_objects(flaky_objects))
    flaky_objects.failing = True
    outcome = await owner.append(batch(values(1)), acks=-1)
    await eventually(lambda: flaky_objects.failures >= 2, "a failed flush")
    started = time.monotonic()
    await owner.close()
    assert time.monotonic() - started < 10  # the back-off gives up instead of waiting for the 30 s cap
    assert outcome.durable is not None and isinstance(outcome.durable.exception(), PartitionError)
    assert await env.meta.get(keys.state(TOPIC, 0)) is None


async def test_metadata_commit_failure_is_retried(env: Env) -> None:
    flaky = FlakyMeta(env.meta)
    owner = await env.owner(meta=flaky)
    flaky.fail_txn_before = 3
    outcome = await owner.append(batch(values(2)), acks=-1)
    await durable(outcome)
    assert flaky.txn_attempts == 1 + 4
    assert owner.high_watermark == 2
    assert len(await env.meta.range(keys.segments(TOPIC, 0))) == 1


@pytest.mark.parametrize("check_fails_too", [False, True], ids=["reply-lost", "reply-and-check-lost"])
async def test_commit_applied_but_reply_lost_makes_no_duplicate_and_no_gap(env: Env, check_fails_too: bool) -> None:
    flaky = FlakyMeta(env.meta)
    flaky_objects = FlakyObjects(env.store)
    owner = await env.owner(meta=flaky, objects=env.async_objects(flaky_objects))
    flaky.fail_txn_after = 1
    flaky.fail_get = int(check_fails_too)  # then the whole flush is retried: upload again, commit again
    first = await owner.append(batch(values(2, "a")), acks=-1)
    await durable(first)
    second = await owner.append(batch(values(2, "b")), acks=-1)
    await durable(second)

    assert (first.base_offset, second.base_offset) == (0, 2)
    assert [kv.value["base"] for kv in await env.meta.range(keys.segments(TOPIC, 0))] == [0, 2]
    state = await env.meta.get(keys.state(TOPIC, 0))
    assert state is not None and state.value["next_offset"] == 4
    assert flaky_objects.deleted == []  # a re-upload of our own object is recognised, not deleted
    expected = list(enumerate(values(2, "a") + values(2, "b")))
    assert (await stored_records(env)) == expected
    assert await read_all(await env.owner()) == expected


def _one_record_batch(value: bytes) -> bytes:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    b.append(0, timestamp=1, key=None, value=value, headers=[])
    return bytes(b.build())


@contextlib.asynccontextmanager
async def _shard_core(tmp_path: Path, fresh: bool = True) -> AsyncIterator[Any]:
    """A started ShardCore on the embedded stores in tmp_path, with (fresh) a new one-partition topic "fresh"."""
    from kafscale.broker.shard import ShardCore
    from kafscale.config import BrokerConfig

    core = ShardCore(0, BrokerConfig(listen="127.0.0.1:0"), meta=EmbeddedStore(tmp_path / "m.db"),
                     objects=LocalDirStore(tmp_path / "o"))
    await core.start()
    try:
        if fresh:
            await core.topics.create("fresh", 1, [0])
        yield core
    finally:
        await core.stop()
        await core.meta.close()


async def test_requests_arriving_while_owner_opens_keep_arrival_order(tmp_path: Path) -> None:
    """A produce that arrives just after the owner finished opening must not overtake earlier ones."""
    async with _shard_core(tmp_path) as core:
        first = asyncio.ensure_future(core.produce("fresh", 0, _one_record_batch(b"A"), 1, 1000))
        while ("fresh", 0) not in core.owners:
            await asyncio.sleep(0)
        second = asyncio.ensure_future(core.produce("fresh", 0, _one_record_batch(b"B"), 1, 1000))
        a, b = await asyncio.gather(first, second)
        assert (a.base_offset, b.base_offset) == (0, 1)


async def test_a_request_on_the_fast_path_does_not_overtake_a_queued_one(tmp_path: Path) -> None:
    """start_produce queues a partition it cannot append to at once before it returns, so a later
    request that finds the partition ready still lines up behind it."""
    async with _shard_core(tmp_path) as core:
        await core.produce_many([("fresh", 0, bytearray(_one_record_batch(b"warm")))], -1, 5000)
        info = core.topics.topics.pop("fresh")  # as if the topic's watch event had not arrived yet
        first = asyncio.ensure_future(core.produce_many([("fresh", 0, bytearray(_one_record_batch(b"A")))], 1, 5000))
        await asyncio.sleep(0)  # first's synchronous part ran; its queued append has not started
        core.topics.topics["fresh"] = info  # the event arrives: the partition is ready for the fast path
        second = await core.produce_many([("fresh", 0, bytearray(_one_record_batch(b"B")))], 1, 5000)
        assert [r.base_offset for r in await first + second] == [1, 2]


async def test_a_queued_request_cancelled_before_it_ran_leaves_the_fast_path_open(tmp_path: Path) -> None:
    """The listener cancels the answers of a connection that went away, possibly in the same loop
    iteration as the request arrived. A partition's queued mark must not outlive that: otherwise every
    later produce to it takes the slow path (a lock and a task) until the shard restarts."""
    async with _shard_core(tmp_path) as core:
        await core.produce_many([("fresh", 0, bytearray(_one_record_batch(b"warm")))], -1, 5000)
        info = core.topics.topics.pop("fresh")  # the partition is not ready: the request queues
        answer = core.start_produce([("fresh", 0, bytearray(_one_record_batch(b"A")))], 1, 5000, lambda r: r)
        assert ("fresh", 0) in core.producer._queued
        answer.cancel()  # before the request's task or its queued append ever ran
        core.topics.topics["fresh"] = info
        await eventually(lambda: ("fresh", 0) not in core.producer._queued, "queued mark undone")
        assert core.producer.try_produce("fresh", 0, bytearray(_one_record_batch(b"B")), 1) is not None
        # The queued append itself cancelled before its first step: its own `finally` never runs.
        append = core.producer._queue_append("fresh", 0, bytearray(_one_record_batch(b"C")), 1,
                                    asyncio.get_running_loop().time() + 5)
        append.cancel()
        await eventually(lambda: append.done() and ("fresh", 0) not in core.producer._queued,
                         "cancelled append unmarked")
        assert append.cancelled()


async def test_produce_many_answers_every_partition_in_request_order(tmp_path: Path) -> None:
    """Fast-path, queued and failing partitions of one acks=all request, each answered in its place
    once durable."""
    async with _shard_core(tmp_path) as core:
        await core.topics.create("two", 2, [0])
        await core.produce_many([("fresh", 0, bytearray(_one_record_batch(b"warm")))], -1, 5000)
        items = [("two", 1, bytearray(_one_record_batch(b"q"))),  # owner not open yet: queued
                 ("fresh", 0, bytearray(_one_record_batch(b"f"))),  # open: fast path
                 ("nope", 0, bytearray(_one_record_batch(b"x"))),
                 ("fresh", 0, bytearray(b"garbage"))]
        results = await core.produce_many(items, -1, 5000)
        assert [(r.error, r.base_offset) for r in results] == [
            (0, 0), (0, 1), (int(ErrorCode.unknown_topic_or_partition), -1), (int(ErrorCode.corrupt_message), -1)]
        owner = core.owners[("fresh", 0)]
        assert owner.high_watermark == 2, "acks=all answered before the fast-path records were committed"


# ---------------------------------------------------------------- opening owners


async def test_a_new_topics_partitions_open_before_their_first_produce(tmp_path: Path) -> None:
    """As Kafka's leaders do on creation: the shard opens the owners of a new topic's partitions (and of
    partitions added later) at once, so the first produce does not wait for the epoch and state reads."""
    import dataclasses

    from kafscale.cluster.placement import spread

    async with _shard_core(tmp_path) as core:
        await core.topics.create("early", 3, [0])
        await eventually(lambda: all(("early", p) in core.owners for p in range(3)), "owners opened on creation")
        assert [core.owners[("early", p)].epoch for p in range(3)] == [1, 1, 1]

        await core.topics.modify("early", lambda i: dataclasses.replace(i, partitions=5,
                                                                       placement=spread("early", 5, [0])))
        await eventually(lambda: all(("early", p) in core.owners for p in range(5)), "added partitions opened")

        answer = await core.produce_many([("early", 4, bytearray(_one_record_batch(b"A")))], -1, 5000)
        assert answer[0].error == 0 and answer[0].base_offset == 0
        assert core.owners[("early", 4)].epoch == 1  # the produce used the owner opened early


async def test_a_restarted_shard_opens_existing_partitions_only_when_used(tmp_path: Path) -> None:
    """Restarting a shard that hosts thousands of partitions must not take every epoch at once: topics that
    already exist open on first use, as before."""
    async with _shard_core(tmp_path) as core:
        await core.topics.create("old", 4, [0])
        await eventually(lambda: len([k for k in core.owners if k[0] == "old"]) == 4, "owners opened on creation")
    async with _shard_core(tmp_path, fresh=False) as core:  # the same stores: "old" exists
        await asyncio.sleep(0.2)
        assert not [k for k in core.owners if k[0] == "old"]
        await core.produce_many([("old", 1, bytearray(_one_record_batch(b"A")))], -1, 5000)
        assert [k for k in core.owners if k[0] == "old"] == [("old", 1)]


async def test_a_topic_with_more_partitions_than_early_open_max_opens_them_on_use(tmp_path: Path) -> None:
    from kafscale.broker.owners import EARLY_OPEN_MAX

    async with _shard_core(tmp_path) as core:
        await core.topics.create("huge", EARLY_OPEN_MAX + 1, [0])
        await asyncio.sleep(0.2)
        assert not [k for k in core.owners if k[0] == "huge"]


async def test_stopping_while_new_partitions_open_leaves_no_owner_behind(tmp_path: Path) -> None:
    from kafscale.broker.owners import EARLY_OPEN_MAX

    async with _shard_core(tmp_path) as core:
        await core.topics.create("many", EARLY_OPEN_MAX, [0])
        await asyncio.sleep(0)
        await core.stop()
        assert not core.owners and not core._opening
        await asyncio.sleep(0.2)
        assert not core.owners, "an owner opened after the shard stopped"
        core.stop = _async_noop  # type: ignore[method-assign]  # already stopped: _shard_core's stop is moot


async def _async_noop() -> None:
    return None


async def test_a_burst_of_first_uses_opens_at_most_opens_at_once_partitions_together(tmp_path: Path) -> None:
    """A client touching many unopened partitions (or a restarted shard's clients) must not start an epoch
    transaction for each of them at the same moment: the opens queue, and every one completes."""
    from kafscale.broker.owners import OPENS_AT_ONCE
    from kafscale.cluster import keys

    async with _shard_core(tmp_path) as core:
        count = OPENS_AT_ONCE * 2 + 10  # above EARLY_OPEN_MAX too: nothing opens before use
        await core.topics.create("burst", count, [0])
        txn = core.meta.txn
        owner_keys = {keys.owner("burst", p) for p in range(count)}
        running, most = 0, 0

        async def counting_txn(compares: Any, success: Any, failure: Any = ()) -> Any:
            nonlocal running, most
            taking_epoch = any(getattr(op, "key", None) in owner_keys for op in success)
            running += taking_epoch
            most = max(most, running)
            try:
                await asyncio.sleep(0.01)  # hold the slot long enough for the others to pile up
                return await txn(compares, success, failure)
            finally:
                running -= taking_epoch

        core.meta.txn = counting_txn  # type: ignore[method-assign]
        owners = await asyncio.gather(*(core.owner("burst", p) for p in range(count)))
        assert [o.partition for o in owners] == list(range(count)) and all(o.epoch == 1 for o in owners)
        assert most == OPENS_AT_ONCE
