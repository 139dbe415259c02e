"""A controller restarted in the middle of autoscaling carries its predecessor's decision on (actors/scaler.py,
with the real embedded metadata store): a drain that was begun is finished and the shard stopped, a scale-up
that was decided starts the shards still missing. The controller's own hand-off and forget steps are stood in
for by plain functions on the same store: what they do is tested with real shards in tests/cluster."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from kafscale.actors.scaler import Scaler
from kafscale.cluster import placement_store as store
from kafscale.cluster.assign import Move
from kafscale.cluster.topics import TopicRegistry
from kafscale.config import BrokerConfig
from kafscale.storage.embedded_store import EmbeddedStore

CONFIG = BrokerConfig(autoscale=True, min_shards=1, max_shards=3)


@pytest.fixture
async def meta(tmp_path: Path) -> AsyncIterator[EmbeddedStore]:
    meta = EmbeddedStore(tmp_path / "meta.db")
    await TopicRegistry(meta).create("t", 6, [0, 1, 2])
    await store.ensure_group_slots(meta, [0, 1, 2])
    for shard in (0, 1, 2):
        await store.want(meta, store.WantedShard(shard, f"node-{shard}", "127.0.0.1", 0, "127.0.0.1", 9092 + shard))
    try:
        yield meta
    finally:
        await meta.close()


async def test_a_drain_begun_before_the_restart_is_finished_and_the_shard_stopped(meta: EmbeddedStore) -> None:
    # The predecessor decided 3 -> 2, chose shard 2, marked it draining, and died before moving anything.
    await store.set_scale_state(meta, store.ScaleState(2, (2,), "scale down to 2"))
    await store.set_draining(meta, {2})
    forgotten: list[int] = []

    async def hand_off(moves: list[Move]) -> list[dict[str, Any]]:
        return [{"moved": True} for _ in await store.write_moves(meta, moves)]

    async def forget(shard: int) -> None:
        forgotten.append(shard)
        await store.forget(meta, shard)

    scaler = Scaler(CONFIG)  # a new controller: nothing in memory
    await scaler.step(meta, {}, {0, 1, 2}, {s: f"node-{s}" for s in (0, 1, 2)}, 3, hand_off, forget)
    assert scaler._task is not None
    await scaler._task

    assert forgotten == [2]
    assert 2 not in set(store.partition_assignment(await store.topics(meta)).values())
    assert 2 not in set(store.slot_assignment(await store.group_slots(meta)).values())
    assert await store.draining(meta) == set()
    assert await store.scale_state(meta) == store.ScaleState(2, (), "scale down to 2")
    assert set(await store.wanted_shards(meta)) == {0, 1}


async def test_a_scale_up_decided_before_the_restart_starts_the_shards_still_missing(meta: EmbeddedStore) -> None:
    # Decided 2 -> 3; the predecessor died before the third shard was placed.
    await store.forget(meta, 2)
    await store.set_scale_state(meta, store.ScaleState(3, (), "scale up to 3"))

    async def never(*_: Any) -> Any:
        raise AssertionError("nothing is moved or stopped on the way up")

    scaler = Scaler(CONFIG)
    await scaler.step(meta, {}, {0, 1}, {0: "node-0", 1: "node-1"}, 3, never, never)
    nodes = [{"NodeID": f"node-{i}", "Resources": {"CPU": 1.0}} for i in range(3)]
    fit = scaler.fit(nodes, {"node-0": 1, "node-1": 1})
    assert fit.per_node == {"node-0": 1, "node-1": 1, "node-2": 1} and fit.unplaced == 0


def test_a_drained_shard_once_forgotten_leaves_its_node_empty_before_the_drain_ends() -> None:
    # 3 -> 1: shards 0 and 2 drain. The drain forgets shard 2, and for a moment the scale state still lists it
    # as being removed. Counted then, its node would be handed a new shard in its place (seen once: a shard 3
    # started on shard 2's node right after shard 2 stopped, and the idle cluster did not get back to 1).
    scaler = Scaler(CONFIG)
    scaler.state = store.ScaleState(1, (0, 2), "scale down to 1")
    nodes = [{"NodeID": f"node-{i}", "Resources": {"CPU": 1.0}} for i in range(3)]
    draining = scaler.fit(nodes, {"node-0": 1, "node-1": 1, "node-2": 1}, present={0, 1, 2})
    assert sum(draining.per_node.values()) == 3  # both still run while their work moves
    forgotten = scaler.fit(nodes, {"node-0": 1, "node-1": 1}, present={0, 1})
    assert forgotten.per_node.get("node-2", 0) == 0 and sum(forgotten.per_node.values()) == 2
