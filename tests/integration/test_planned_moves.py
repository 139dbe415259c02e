"""The controller's hand-offs (kafscale.actors.planned_moves) on the real embedded metadata store: at most
`moves_in_flight` run at once, and a source that cannot release is fenced instead (the move still happens, at a
higher leader epoch). The shards' release calls are stood in for by plain objects with Ray's `.remote` shape;
real shards releasing are tested in tests/cluster."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kafscale.actors.planned_moves import hand_off
from kafscale.cluster import placement_store as store
from kafscale.cluster.assign import Move
from kafscale.cluster.topics import TopicRegistry
from kafscale.storage.embedded_store import EmbeddedStore


class Release:
    """A shard's `release` as the controller calls it: `.remote(topic, partition)` gives an awaitable."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.running = self.peak = 0

    async def _release(self, topic: str, partition: int) -> int:
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await asyncio.sleep(0.05)
            if self.fail:
                raise ConnectionError("the shard's node is gone")
            return 0
        finally:
            self.running -= 1

    def remote(self, topic: str, partition: int) -> asyncio.Future[int]:
        return asyncio.ensure_future(self._release(topic, partition))


@pytest.fixture
async def meta(tmp_path: Path) -> AsyncIterator[EmbeddedStore]:
    meta = EmbeddedStore(tmp_path / "meta.db")
    await TopicRegistry(meta).create("t", 8, [0])
    try:
        yield meta
    finally:
        await meta.close()


async def test_at_most_moves_in_flight_hand_offs_run_at_once(meta: EmbeddedStore) -> None:
    release = Release()
    done = await hand_off(meta, [Move(("t", p), 0, 1) for p in range(8)], {0: release}, asyncio.Semaphore(3))
    assert release.peak == 3
    assert all(d["moved"] for d in done)
    assert set(store.partition_assignment(await store.topics(meta)).values()) == {1}


async def test_a_source_that_cannot_release_is_fenced_and_the_move_still_happens(meta: EmbeddedStore) -> None:
    epochs = (await store.topics(meta))["t"].leader_epochs
    done = await hand_off(meta, [Move(("t", 0), 0, 1)], {0: Release(fail=True)}, asyncio.Semaphore(1))
    assert done[0]["moved"] and done[0]["from"] == 0 and done[0]["to"] == 1
    info = (await store.topics(meta))["t"]
    assert info.placement[0] == 1
    assert info.leader_epochs[0] > epochs[0], "the successor's higher epoch is what fences the old owner"
