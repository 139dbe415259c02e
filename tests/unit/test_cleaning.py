"""A shard's cleaner on one partition owner (kafscale.broker.cleaning), on the real embedded stores: the swap,
what a new owner finds after it, the fencing of a deposed owner's pass, and reads through the ranged path."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords

from kafscale.broker import cleaning
from kafscale.broker.flush import FencedError
from kafscale.broker.partition_owner import OwnerSettings, PartitionOwner
from kafscale.cluster import keys
from kafscale.compaction.cleaner import Job, Outcome
from kafscale.storage.cache import ByteLRU
from kafscale.storage.object_store import ObjectStore
from tests.unit.test_partition_owner import NS, TOPIC, Env, durable
from tests.unit.test_read_path import batch_spans

COMPACT = {"cleanup.policy": "compact"}
SETTINGS = cleaning.CleanerSettings(interval_s=1, map_entries=1000)


def keyed(*rows: tuple[bytes, bytes | None], ts: int = 1_000) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
    for i, (key, value) in enumerate(rows):
        assert builder.append(i, timestamp=ts, key=key, value=value, headers=[]) is not None
    return bytes(builder.build())


async def owner_of(env: Env, configs: dict[str, Any] | None = None, cache: int = 64 << 20) -> PartitionOwner:
    owner = PartitionOwner(TOPIC, 0, shard_id=len(env.owners), meta=env.meta, objects=env.objects,
                           cache=ByteLRU(cache), settings=OwnerSettings(namespace=NS, flush_interval_ms=20),
                           topic_config=lambda: dict(COMPACT if configs is None else configs))
    await owner.open()
    env.owners.append(owner)
    return owner


async def write(owner: PartitionOwner, *batches: bytes) -> None:
    for b in batches:  # one segment each: every append is made durable before the next
        await durable(await owner.append(b, acks=-1))


async def everything(owner: PartitionOwner) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record, read through the owner's read path, fetch after fetch, as a
    consumer reads: from the log start, each read at the offset after the last record it got."""
    out: list[tuple[int, bytes | None, bytes | None]] = []
    offset = owner.log_start_offset
    while offset < owner.high_watermark:
        stream = MemoryRecords(await owner.reader.read(offset, 1 << 20))
        got = []
        while (b := stream.next_batch()) is not None:
            got += [(r.offset, r.key, r.value) for r in b if r.offset >= offset]
            offset = max(offset, b.next_offset)
        assert got or offset >= owner.high_watermark, f"nothing read at {offset}"
        out += got
    return out


async def test_a_pass_swaps_the_segments_and_a_new_owner_finds_the_cleaned_log(env: Env) -> None:
    owner = await owner_of(env)
    await write(owner, keyed((b"a", b"a0"), (b"b", b"b0")), keyed((b"a", b"a1")), keyed((b"b", None)),
                keyed((b"c", b"c0")))
    assert len(owner.segments) == 4
    outcome = await cleaning.clean_if_due(owner, SETTINGS)
    assert outcome is not None and outcome.cleaned_to == 5
    assert [(s.base, s.last, s.records, s.cleaned > 0) for s in owner.segments] == [(0, 4, 3, True)]
    expected = [(2, b"a", b"a1"), (3, b"b", None), (4, b"c", b"c0")]
    assert (await everything(owner)) == expected
    assert await cleaning.clean_if_due(owner, SETTINGS) is None  # nothing dirty: not due
    await owner.close()

    again = await owner_of(env)  # the swap and the checkpoint are durable
    assert [(s.base, s.last, s.records) for s in again.segments] == [(0, 4, 3)]
    assert (await everything(again)) == expected
    assert (await cleaning.checkpoint(again)) == 5
    await write(again, keyed((b"c", b"c1")))
    plan = await cleaning.assess(again, cleaning.compaction_config(again), 10**13)
    assert (plan.first_dirty, plan.dirty_bytes > 0, plan.dirty_ratio < 1) == (5, True, True)


async def test_a_deposed_owners_pass_never_commits(env: Env) -> None:
    old = await owner_of(env)
    await write(old, keyed((b"a", b"a0")), keyed((b"a", b"a1")))
    new: list[PartitionOwner] = []

    async def deposed_meanwhile(job: Job, store: ObjectStore) -> Outcome:
        outcome = cleaning.clean_with_store(job, store)  # its objects are written under the old epoch's keys
        new.append(await owner_of(env))  # another shard takes the partition before the swap
        return outcome

    with pytest.raises(FencedError):
        await cleaning.clean_if_due(old, SETTINGS, deposed_meanwhile)
    assert old.fenced
    assert (await everything(new[0])) == [(0, b"a", b"a0"), (1, b"a", b"a1")]
    assert [s.cleaned for s in new[0].segments] == [0, 0]
    assert await env.meta.get(keys.cleaner(TOPIC, 0)) is None


async def test_ranged_reads_skip_the_removed_records(env: Env) -> None:
    owner = await owner_of(env)
    await write(owner, *[keyed(*[(b"k%d" % (i % 3), b"v%d" % i)]) for i in range(12)])
    await cleaning.clean_if_due(owner, SETTINGS)
    await owner.close()
    reader = await owner_of(env, cache=1024)  # segments above 128 bytes are read by ranged GETs from the index
    assert reader.reader._whole_segments(reader.segments[0]) is False
    assert [base for base, _, _ in batch_spans(await reader.reader.read(0, 1 << 20))] == [9, 10, 11]
    assert [base for base, _, _ in batch_spans(await reader.reader.read(10, 1 << 20))] == [10, 11]


async def test_a_topic_that_is_not_compacted_is_left_alone(env: Env) -> None:
    owner = await owner_of(env, {"cleanup.policy": "delete"})
    await write(owner, keyed((b"a", b"a0")), keyed((b"a", b"a1")))
    assert await cleaning.clean_if_due(owner, SETTINGS, force=True) is None
    assert len(owner.segments) == 2


async def test_a_ray_tasks_pass_runs_at_a_lower_cpu_priority_than_the_thread_that_asked_for_it(env: Env) -> None:
    owner = await owner_of(env)
    await write(owner, keyed((b"a", b"a0")), keyed((b"a", b"a1")))
    seen: list[tuple[int, int]] = []

    def priority() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    async def watched(job: Job, store: ObjectStore) -> Outcome:
        get = store.get

        def reading(key: str) -> bytes:
            seen.append((threading.get_native_id(), priority()))
            return get(key)

        store.get = reading  # type: ignore[method-assign]
        try:
            return cleaning.clean_at_low_priority(job, store)
        finally:
            store.get = get  # type: ignore[method-assign]

    before = priority()
    assert (await cleaning.clean_if_due(owner, SETTINGS, watched)) is not None
    assert seen and {p for _, p in seen} == {min(before + cleaning.PASS_NICENESS, 19)}
    assert threading.get_native_id() not in {t for t, _ in seen} and priority() == before
