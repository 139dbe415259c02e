"""CommitBatcher: flush commits of many partition owners share metadata transactions, and a fenced owner in a
batch is refused alone. Real stores (the embedded one; etcd where the point is its transaction limits)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kafscale.actors.commit_batcher import MAX_BATCH_OPS, CommitBatcher
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.metadata_store import Compare, Put
from tests.test_partition_owner import FlakyMeta


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmbeddedStore]:
    s = EmbeddedStore(tmp_path / "meta.sqlite", fsync=False)
    yield s
    await s.close()


async def owner_keys(store: EmbeddedStore, n: int) -> list[int]:
    """n owner keys; returns the revision each commit must compare against."""
    return [await store.put(f"owner/{i}", {"epoch": 1}) for i in range(n)]


def guard(i: int, revision: int) -> list[Compare]:
    return [Compare(f"owner/{i}", "mod_revision", "==", revision)]


async def test_commits_arriving_during_one_share_the_next_transaction(store: EmbeddedStore) -> None:
    meta = FlakyMeta(store)
    batcher = CommitBatcher(meta)
    revisions = await owner_keys(store, 20)
    meta.gate.clear()  # the first commit goes at once and is held in flight; the others queue behind it
    first = asyncio.ensure_future(batcher.commit(guard(0, revisions[0]), [Put("state/0", {"n": 0})]))
    await asyncio.sleep(0.05)
    rest = [asyncio.ensure_future(batcher.commit(guard(i, revisions[i]), [Put(f"state/{i}", {"n": i})]))
            for i in range(1, 20)]
    await asyncio.sleep(0.05)
    meta.gate.set()
    assert await first and all(await asyncio.gather(*rest))
    assert batcher.transactions == 2
    for i in range(20):
        kv = await store.get(f"state/{i}")
        assert kv is not None and kv.value == {"n": i}


async def test_a_fenced_owner_in_a_batch_is_refused_alone(store: EmbeddedStore) -> None:
    meta = FlakyMeta(store)
    batcher = CommitBatcher(meta)
    revisions = await owner_keys(store, 4)
    await store.put("owner/2", {"epoch": 2})  # a successor took partition 2 over: its old owner is fenced
    meta.gate.clear()
    blocker = asyncio.ensure_future(batcher.commit([], [Put("other", 1)]))
    await asyncio.sleep(0.05)
    results = [asyncio.ensure_future(batcher.commit(guard(i, revisions[i]), [Put(f"state/{i}", i)]))
               for i in range(4)]
    await asyncio.sleep(0.05)
    meta.gate.set()
    assert await blocker
    assert await asyncio.gather(*results) == [True, True, False, True]
    assert [kv.value if (kv := await store.get(f"state/{i}")) else None for i in range(4)] == [0, 1, None, 3]


async def test_batches_stay_under_the_transaction_size_limit(store: EmbeddedStore) -> None:
    meta = FlakyMeta(store)
    batcher = CommitBatcher(meta)
    revisions = await owner_keys(store, 100)
    meta.gate.clear()
    blocker = asyncio.ensure_future(batcher.commit([], [Put("other", 1)]))
    await asyncio.sleep(0.05)
    # Each commit is 1 compare + 3 puts: a batch holds MAX_BATCH_OPS // 4 of them.
    results = [asyncio.ensure_future(batcher.commit(guard(i, revisions[i]), [Put(f"s/{i}/{j}", j) for j in range(3)]))
               for i in range(100)]
    await asyncio.sleep(0.05)
    meta.gate.set()
    assert await blocker and all(await asyncio.gather(*results))
    assert batcher.transactions == 1 + math.ceil(100 / (MAX_BATCH_OPS // 4))  # the blocker, then full batches


async def test_a_store_error_reaches_every_commit_of_the_batch(store: EmbeddedStore) -> None:
    meta = FlakyMeta(store)
    batcher = CommitBatcher(meta)
    revisions = await owner_keys(store, 3)
    meta.gate.clear()
    blocker = asyncio.ensure_future(batcher.commit([], [Put("other", 1)]))
    await asyncio.sleep(0.05)
    meta.fail_txn_before = 1  # decided on arrival: the combined transaction of the next batch fails
    results = [asyncio.ensure_future(batcher.commit(guard(i, revisions[i]), [Put(f"state/{i}", i)]))
               for i in range(3)]
    await asyncio.sleep(0.05)
    meta.gate.set()
    assert await blocker
    outcomes = await asyncio.gather(*results, return_exceptions=True)
    assert all(isinstance(o, Exception) and "not applied" in str(o) for o in outcomes)
    assert [await store.get(f"state/{i}") for i in range(3)] == [None, None, None]
