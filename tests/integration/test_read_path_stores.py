"""ReadPath's ranged reads and corruption checks on the local directory store and on a real S3 API (moto): the
tests of tests/unit/test_read_path.py that need the session's moto server, split from it whole (helpers are
imported from there)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kafscale.storage.batch import InvalidBatchError
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.local_store import LocalDirStore
from kafscale.testing.s3_servers import MotoS3Server
from tests.unit.test_partition_owner import Env, batch, read_all, records_of, segment_object_key, values
from tests.unit.test_read_path import SMALL_CACHE, _corrupt, batch_spans, cold_reader, segment_gets, write_segments


@pytest.fixture(params=["local", "moto"])
def s3_server(request: pytest.FixtureRequest) -> MotoS3Server | None:
    """Fetched outside any event loop, and only when the S3 variant runs."""
    return request.getfixturevalue("moto_server") if request.param == "moto" else None


@pytest.fixture
async def store_env(s3_server: MotoS3Server | None, tmp_path: Path) -> AsyncIterator[Env]:
    """Ranged GETs and corruption on the local directory store and on a real S3 API (moto)."""
    meta = EmbeddedStore(tmp_path / "meta.sqlite", fsync=False)
    if s3_server is None:
        e = Env(meta, LocalDirStore(tmp_path / "objects"))
    else:
        bucket = s3_server.store()
        e = Env(meta, bucket)
    try:
        yield e
    finally:
        await e.aclose()
        await meta.close()
        if s3_server is not None:
            s3_server.delete_bucket(bucket.bucket)


async def test_large_segments_are_read_by_ranged_gets_through_the_index(store_env: Env) -> None:
    small = [batch(values(3, f"b{i}-", 100)) for i in range(12)]  # about 400 bytes each
    big_value = os.urandom(300_000)  # a batch larger than one ranged GET (256 KiB)
    await write_segments(store_env, [small, [batch([big_value]), batch(values(2, "after"))]],
                         index_interval_bytes=512)
    owner, counted = await cold_reader(store_env, cache_bytes=SMALL_CACHE)
    expected = [v for vs in (values(3, f"b{i}-", 100) for i in range(12)) for v in vs]
    expected += [big_value, *values(2, "after")]

    for offset in range(39):
        for max_bytes in (1, 1000, 1 << 20):
            data = await owner.reader.read(offset, max_bytes)
            spans = batch_spans(data)
            assert spans[0][0] <= offset <= spans[0][1], (offset, spans)  # starts at the batch holding offset
            assert len(spans) == 1 or len(data) <= max_bytes  # at least one batch, else within max_bytes
            assert [s[0] for s in spans[1:]] == [s[1] + 1 for s in spans[:-1]]  # whole, contiguous batches
            assert all(expected[o] == v for o, v in records_of(data))
    assert segment_gets(counted) == []  # never a whole-object GET
    assert {key for op, key in counted.keys if op == "get_range"} == {segment_object_key(0), segment_object_key(36)}
    assert [v for _, v in await read_all(owner, max_bytes=1)] == expected


@pytest.mark.parametrize("where", ["record-bytes", "base-offset", "truncated"])
@pytest.mark.parametrize("cache_bytes", [64 << 20, SMALL_CACHE], ids=["whole", "ranged"])
async def test_a_corrupted_segment_is_an_error_never_bad_data(store_env: Env, where: str, cache_bytes: int) -> None:
    offset = await _corrupt(store_env, where)
    owner, _ = await cold_reader(store_env, cache_bytes=cache_bytes)
    with pytest.raises(InvalidBatchError):
        await asyncio.wait_for(owner.reader.read(offset, 1 << 20), 10)
