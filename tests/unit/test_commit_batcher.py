"""CommitBatcher: flush commits of many partition owners share metadata transactions, and a fenced owner in a
batch is refused alone. Real stores (the embedded one; etcd where the point is its transaction limits)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

from kafscale.broker.commit_batcher import CommitBatcher
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.metadata_store import MAX_TXN_OPS, Compare, Op, Put
from tests.unit.test_partition_owner import FlakyMeta


async def owner_keys(store: EmbeddedStore, n: int) -> list[int]:
    """n owner keys; returns the revision each commit must compare against."""
    return [await store.put(f"owner/{i}", {"epoch": 1}) for i in range(n)]


def guard(i: int, revision: int) -> list[Compare]:
    return [Compare(f"owner/{i}", "mod_revision", "==", revision)]


async def behind_a_held_commit(meta: FlakyMeta, batcher: CommitBatcher, commits: list[tuple[list[Compare], list[Op]]],
                               before_release: Callable[[], None] = lambda: None) -> list[bool | BaseException]:
    """Send one commit and hold it in flight, queue `commits` behind it, release it: returns their outcomes."""
    meta.gate.clear()
    first = asyncio.ensure_future(batcher.commit([], [Put("first", 1)]))
    await asyncio.sleep(0.05)
    before_release()
    queued = [asyncio.ensure_future(batcher.commit(compares, ops)) for compares, ops in commits]
    await asyncio.sleep(0.05)
    meta.gate.set()
    assert await first
    return list(await asyncio.gather(*queued, return_exceptions=True))


async def test_commits_arriving_during_one_share_the_next_transaction(store: EmbeddedStore) -> None:
    meta = FlakyMeta(store)
    batcher = CommitBatcher(meta)
    revisions = await owner_keys(store, 20)
    commits = [(guard(i, revisions[i]), [Put(f"state/{i}", {"n": i})]) for i in range(20)]
    assert await behind_a_held_commit(meta, batcher, commits) == [True] * 20
    assert batcher.transactions == 2
    for i in range(20):
        kv = await store.get(f"state/{i}")
        assert kv is not None and kv.value == {"n": i}


async def test_a_fenced_owner_in_a_batch_is_refused_alone(store: EmbeddedStore) -> None:
    meta = FlakyMeta(store)
    batcher = CommitBatcher(meta)
    revisions = await owner_keys(store, 4)
    await store.put("owner/2", {"epoch": 2})  # a successor took partition 2 over: its old owner is fenced
    commits = [(guard(i, revisions[i]), [Put(f"state/{i}", i)]) for i in range(4)]
    assert await behind_a_held_commit(meta, batcher, commits) == [True, True, False, True]
    assert [kv.value if (kv := await store.get(f"state/{i}")) else None for i in range(4)] == [0, 1, None, 3]


async def test_batches_stay_under_the_transaction_size_limit(store: EmbeddedStore) -> None:
    meta = FlakyMeta(store)
    batcher = CommitBatcher(meta)
    revisions = await owner_keys(store, 100)
    # Each commit is 1 compare + 3 puts: a batch holds MAX_TXN_OPS // 4 of them.
    commits = [(guard(i, revisions[i]), [Put(f"s/{i}/{j}", j) for j in range(3)]) for i in range(100)]
    assert await behind_a_held_commit(meta, batcher, commits) == [True] * 100
    assert batcher.transactions == 1 + math.ceil(100 / (MAX_TXN_OPS // 4))  # the held one, then full batches


async def test_a_store_error_reaches_every_commit_of_the_batch(store: EmbeddedStore) -> None:
    meta = FlakyMeta(store)
    batcher = CommitBatcher(meta)
    revisions = await owner_keys(store, 3)
    commits = [(guard(i, revisions[i]), [Put(f"state/{i}", i)]) for i in range(3)]

    def fail_next() -> None:
        meta.fail_txn_before = 1  # decided on arrival: the combined transaction of the batch fails

    outcomes = await behind_a_held_commit(meta, batcher, commits, fail_next)
    assert all(isinstance(o, Exception) and "not applied" in str(o) for o in outcomes)
    assert [await store.get(f"state/{i}") for i in range(3)] == [None, None, None]


async def test_a_packs_announced_commits_share_one_transaction_though_they_arrive_apart(store: EmbeddedStore) -> None:
    revisions = await owner_keys(store, 10)

    async def lanes_commit(announce: bool) -> int:
        batcher = CommitBatcher(store)
        if announce:
            batcher.expect("pack-a", [("t", i) for i in range(10)])
        commits = []
        for i in range(10):  # each lane reaches its commit a few loop turns after the previous one
            commits.append(asyncio.ensure_future(
                batcher.commit(guard(i, revisions[i]), [Put(f"state/{i}", {"n": i})], ["pack-a"], ("t", i))))
            for _ in range(3):
                await asyncio.sleep(0)
        assert await asyncio.gather(*commits) == [True] * 10
        return batcher.transactions

    assert await lanes_commit(announce=False) >= 2  # the first lane's commit goes alone
    assert await lanes_commit(announce=True) == 1


async def test_an_announced_commit_that_never_comes_holds_the_others_only_briefly(store: EmbeddedStore) -> None:
    from kafscale.broker.commit_batcher import GATHER_S

    batcher = CommitBatcher(store)
    batcher.expect("pack-b", [("t", 0), ("t", 1), ("t", 2)])  # lane 2 cannot commit yet (an earlier upload)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await asyncio.gather(batcher.commit([], [Put("s/0", 0)], ["pack-b"], ("t", 0)),
                                batcher.commit([], [Put("s/1", 1)], ["pack-b"], ("t", 1))) == [True, True]
    assert batcher.transactions == 1
    assert loop.time() - started < GATHER_S + 0.5
    assert await batcher.commit([], [Put("s/2", 2)], ["pack-b"], ("t", 2))  # late: it goes on its own, unheld
    assert batcher.transactions == 2


async def test_announcements_during_a_hold_do_not_prolong_it(store: EmbeddedStore) -> None:
    """Packs announced while a transaction waits are the next one's business: a plain commit waits about
    GATHER_S at most, however many packs with a lane that never comes are announced meanwhile."""
    from kafscale.broker.commit_batcher import GATHER_S

    batcher = CommitBatcher(store)
    batcher.expect("pack-0", [("t", 0), ("t", 99)])
    stop = asyncio.Event()

    async def announce() -> None:
        n = 1
        while not stop.is_set():
            batcher.expect(f"pack-{n}", [("t", n), ("t", 99)])  # lane 99 never commits
            n += 1
            await asyncio.sleep(GATHER_S / 4)

    announcer = asyncio.ensure_future(announce())
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await batcher.commit([], [Put("plain", 1)], (), ("u", 0))
    held = loop.time() - started
    stop.set()
    await announcer
    assert held < GATHER_S * 3, f"a plain commit was held {held:.3f} s"


async def test_a_lane_with_a_commit_queued_already_is_not_waited_for(store: EmbeddedStore) -> None:
    """Lane 1's commit of its previous pack is queued (behind one in flight): its next pack's commit cannot come
    before that is sent, so the next transaction does not wait for it."""
    from kafscale.broker.commit_batcher import GATHER_S

    meta = FlakyMeta(store)
    batcher = CommitBatcher(meta)
    meta.gate.clear()
    first = asyncio.ensure_future(batcher.commit([], [Put("first", 1)]))
    await asyncio.sleep(0.05)
    previous = asyncio.ensure_future(batcher.commit([], [Put("lane1-a", 1)], ["pack-a"], ("t", 1)))
    await asyncio.sleep(0)
    batcher.expect("pack-b", [("t", 0), ("t", 1)])
    other = asyncio.ensure_future(batcher.commit([], [Put("lane0-b", 1)], ["pack-b"], ("t", 0)))
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    meta.gate.set()
    assert await first and await previous and await other
    assert loop.time() - started < GATHER_S, "held for a lane whose commit was queued already"
