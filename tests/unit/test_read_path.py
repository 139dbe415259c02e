"""ReadPath through PartitionOwner: segment cache, read-ahead, ranged reads through the index, corruption,
timestamp lookup, gaps. Data is written by one owner; a second owner with a cold cache (a new process)
reads it back from the object store. Ranged reads and corruption on the local store and on moto S3 are in
tests/integration/test_read_path_stores.py."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from kafscale.broker.partition_owner import PartitionOwner
from kafscale.cluster import keys
from kafscale.storage.batch import split_batches
from kafscale.storage.cache import ByteLRU
from kafscale.storage.segment import SEGMENT_HEADER_SIZE, CorruptSegmentError, build_segment
from tests.unit.test_partition_owner import (
    TOPIC,
    Env,
    FlakyObjects,
    batch,
    durable,
    eventually,
    read_all,
    records_of,
    segment_object_key,
    values,
)

SMALL_CACHE = 8 * 1024  # segments above 1 KiB (cache / 8) are read by ranged GETs


async def write_segments(env: Env, segments: Sequence[Sequence[bytes]], **settings: int) -> None:
    """One segment per element, holding those batches; then the writer goes away."""
    writer = await env.owner(**settings)
    for batches in segments:
        outcomes = [await writer.append(b, acks=-1) for b in batches]
        for outcome in outcomes:
            await durable(outcome)
    assert len(writer.segments) == len(segments)
    await writer.close()


async def cold_reader(env: Env, *, cache_bytes: int = 64 << 20, readahead: int = 0) -> tuple[PartitionOwner,
                                                                                             FlakyObjects]:
    """A new owner with an empty cache, whose object store calls are counted."""
    counted = FlakyObjects(env.store)
    owner = await env.owner(objects=env.async_objects(counted), cache=ByteLRU(cache_bytes),
                            readahead_segments=readahead)
    return owner, counted


def batch_spans(data: bytes) -> list[tuple[int, int, int]]:
    """(base offset, last offset, size) of each batch."""
    return [(h.base_offset, h.last_offset, h.size) for _, h in split_batches(data)]


def segment_gets(counted: FlakyObjects) -> list[str]:
    return [key for op, key in counted.keys if op == "get" and key.endswith(".kfs")]


# ---------------------------------------------------------------- whole-segment cache and read-ahead


async def test_whole_segment_cache_hits_and_misses(env: Env) -> None:
    await write_segments(env, [[batch(values(4, f"s{i}-"))] for i in range(3)])
    owner, counted = await cold_reader(env)
    cache = owner.reader.cache

    assert records_of(await owner.reader.read(0, 1 << 20)) == list(enumerate(values(4, "s0-")))
    assert (cache.hits, cache.misses) == (0, 1)
    assert records_of(await owner.reader.read(2, 1 << 20)) == list(enumerate(values(4, "s0-")))  # its batch
    assert (cache.hits, cache.misses) == (1, 1)
    assert records_of(await owner.reader.read(9, 1 << 20)) == [(8 + i, v) for i, v in enumerate(values(4, "s2-"))]
    assert (cache.hits, cache.misses) == (1, 2)
    assert segment_gets(counted) == [segment_object_key(0), segment_object_key(8)]


async def test_a_flushed_segment_is_served_from_the_cache(env: Env) -> None:
    counted = FlakyObjects(env.store)
    owner = await env.owner(objects=env.async_objects(counted))
    await durable(await owner.append(batch(values(3)), acks=-1))
    assert records_of(await owner.reader.read(0, 1 << 20)) == list(enumerate(values(3)))
    assert (owner.reader.cache.hits, owner.reader.cache.misses) == (1, 0)
    assert segment_gets(counted) == []


async def test_read_ahead_fetches_the_next_segment(env: Env) -> None:
    await write_segments(env, [[batch(values(4, f"s{i}-"))] for i in range(3)])
    owner, counted = await cold_reader(env, readahead=1)
    cache = owner.reader.cache

    await owner.reader.read(0, 1 << 20)
    await eventually(lambda: ("seg", TOPIC, 0, 4, 0) in cache, "segment 4 to be read ahead")
    assert ("seg", TOPIC, 0, 8, 0) not in cache  # one segment ahead only
    assert segment_gets(counted) == [segment_object_key(0), segment_object_key(4)]

    hits = cache.hits
    assert records_of(await owner.reader.read(4, 1 << 20)) == [(4 + i, v) for i, v in enumerate(values(4, "s1-"))]
    assert cache.hits == hits + 1
    await eventually(lambda: ("seg", TOPIC, 0, 8, 0) in cache, "segment 8 to be read ahead")
    assert segment_gets(counted) == [segment_object_key(0), segment_object_key(4), segment_object_key(8)]


# ---------------------------------------------------------------- corruption


async def _corrupt(env: Env, where: str) -> int:
    """Write a segment of three batches, damage its second batch in the stored object; returns an offset in it."""
    batches = [batch(values(3, f"c{i}-", 200)) for i in range(3)]
    await write_segments(env, [batches])
    key = segment_object_key(0)
    data = bytearray(env.store.get(key))
    second = SEGMENT_HEADER_SIZE + len(batches[0])
    if where == "truncated":
        del data[second + 100 :]
    else:
        at = second + 7 if where == "base-offset" else second + 100  # base offset is outside the batch CRC
        data[at] ^= 0x01
    env.store.put(key, bytes(data))
    return 4


async def test_an_object_replaced_after_its_commit_is_refused(env: Env) -> None:
    await write_segments(env, [[batch(values(3, "committed"))]])
    other = build_segment([batch(values(3, "replaced"))], created_ms=1)  # valid, same offsets, other data
    env.store.put(segment_object_key(0), other.data)
    owner, _ = await cold_reader(env)
    with pytest.raises(CorruptSegmentError):
        await owner.reader.read(0, 1 << 20)


# ---------------------------------------------------------------- timestamps and gaps


async def test_offset_for_timestamp_is_the_first_record_at_or_after_it(env: Env) -> None:
    await write_segments(env, [
        [batch(values(3), ts=[100, 300, 200]), batch(values(1), ts=[400])],  # offsets 0-3
        [batch(values(2), ts=[150, 500])],  # offsets 4-5
    ])
    owner, _ = await cold_reader(env)
    lookups = {50: (0, 100), 100: (0, 100), 101: (1, 300), 150: (1, 300), 250: (1, 300), 301: (3, 400),
               400: (3, 400), 401: (5, 500), 500: (5, 500), 501: None}
    for target, expected in lookups.items():
        assert await owner.reader.offset_for_timestamp(target) == expected, target
    assert await owner.reader.max_timestamp_offset() == (5, 500)


async def test_a_gap_between_segments_is_skipped_forward(env: Env) -> None:
    await write_segments(env, [[batch(values(4, f"s{i}-"))] for i in range(3)])
    await env.meta.delete(keys.segment(TOPIC, 0, 4))  # offsets 4-7 are gone
    owner, _ = await cold_reader(env)
    assert [(s.base, s.last) for s in owner.segments] == [(0, 3), (8, 11)]
    assert owner.segment_for(5) is not None and owner.segment_for(5).base == 8
    assert records_of(await owner.reader.read(5, 1 << 20)) == [(8 + i, v) for i, v in enumerate(values(4, "s2-"))]
    assert [o for o, _ in await read_all(owner)] == [0, 1, 2, 3, 8, 9, 10, 11]


async def test_reads_with_concurrent_callers_share_one_get(env: Env) -> None:
    await write_segments(env, [[batch(values(4))]])
    owner, counted = await cold_reader(env)
    results = await asyncio.gather(*(owner.reader.read(i % 4, 1 << 20) for i in range(8)))
    assert all(records_of(r) == list(enumerate(values(4))) for r in results)
    assert segment_gets(counted) == [segment_object_key(0)]
