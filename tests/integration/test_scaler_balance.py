"""When the autoscaler moves partitions between the shards it keeps (actors/scaler.py, on the real embedded
metadata store): only when a shard runs above the target or holds no partition. Shards under the target with
uneven loads are left alone: the busy readings jitter by more than the balancer's tolerance, and every move pauses
its partition's producers (a steady cluster moved a partition every 15-30 s before this rule).

The shards' load reports are given as recorded figures, and hand-off writes the moves to the same store: what the
real shards measure and how moves hand off is tested with real shards in tests/cluster."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from kafscale.actors.scaler import Scaler
from kafscale.cluster import placement_store as store
from kafscale.cluster.assign import Move
from kafscale.cluster.load import PartitionLoad, ShardLoad
from kafscale.cluster.topics import TopicRegistry
from kafscale.config import BrokerConfig
from kafscale.storage.embedded_store import EmbeddedStore

CONFIG = BrokerConfig(autoscale=True, min_shards=1, max_shards=3, target_utilization=0.6, moves_in_flight=2)
SHARDS = (0, 1, 2)


class _Reports:
    """Stands in for a shard actor's handle: `load.remote()` answers the figures given."""

    def __init__(self, load: ShardLoad) -> None:
        self.load = self
        self._load = load

    async def remote(self) -> ShardLoad:
        return self._load


@pytest.fixture
async def meta(tmp_path: Path) -> AsyncIterator[EmbeddedStore]:
    meta = EmbeddedStore(tmp_path / "meta.db")
    try:
        yield meta
    finally:
        await meta.close()


async def moves_made(meta: EmbeddedStore, placement: list[int], busy: dict[int, list[float]],
                     rounds: int = 3) -> list[Move]:
    """Topic "t" placed as given; shard s reports busy[s], partition by partition (in the order it holds them).
    Returns every partition move the scaler made over `rounds` steps."""
    await TopicRegistry(meta).create("t", len(placement), placement)
    await store.ensure_group_slots(meta, list(SHARDS))
    made: list[Move] = []

    async def hand_off(moves: list[Move]) -> list[dict[str, Any]]:
        made.extend(m for m in moves if isinstance(m.item, tuple))
        return [{"moved": True} for _ in await store.write_moves(meta, moves)]

    async def never(_: int) -> None:
        raise AssertionError("no shard is stopped")

    scaler = Scaler(CONFIG)
    for _ in range(rounds):
        held = store.partition_assignment(await store.topics(meta))
        handles = {}
        for s in SHARDS:
            parts = tuple(PartitionLoad("t", p, 1e6 * b, 0.0)
                          for p, b in zip(sorted(p for (_, p), o in held.items() if o == s), busy.get(s, []),
                                          strict=False))
            handles[s] = _Reports(ShardLoad(s, sum(busy.get(s, [])), 0.0, 0.0, 0.0, 1.0, parts))
        scaler.settled_at = 0.0  # each round as if the previous moves' effect had been measured
        await scaler.step(meta, handles, set(SHARDS), {s: f"node-{s}" for s in SHARDS}, 3, hand_off, never)
        if scaler._task is not None:
            await scaler._task
    return made


async def test_shards_under_the_target_keep_their_partitions_however_uneven(meta: EmbeddedStore) -> None:
    # 0.5 / 0.3 / 0.1: a gap of 0.4, far past the balancer's tolerance, but every shard is under 0.6.
    moves = await moves_made(meta, [0, 0, 1, 1, 2, 2], {0: [0.25, 0.25], 1: [0.15, 0.15], 2: [0.05, 0.05]})
    assert moves == []


async def test_a_shard_above_the_target_gives_partitions_to_the_least_loaded(meta: EmbeddedStore) -> None:
    moves = await moves_made(meta, [0, 0, 0, 0, 1, 2], {0: [0.2, 0.2, 0.2, 0.2], 1: [0.1], 2: [0.1]}, rounds=1)
    assert moves and all(m.source == 0 and m.target in (1, 2) for m in moves)
    assert len(moves) <= CONFIG.moves_in_flight


async def test_a_shard_holding_no_partition_gets_some(meta: EmbeddedStore) -> None:
    # A new shard: the others are under the target, but it would otherwise sit idle.
    moves = await moves_made(meta, [0, 0, 0, 1, 1, 1], {0: [0.15, 0.15, 0.15], 1: [0.15, 0.15, 0.15]}, rounds=1)
    assert moves and all(m.target == 2 for m in moves)
