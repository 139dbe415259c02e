"""Placement in the metadata store: moves written by compare-and-swap, and the layout `cluster info` shows."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import asdict
from pathlib import Path

import pytest

from kafscale.cluster import keys
from kafscale.cluster import placement_store as store
from kafscale.cluster.assign import Move
from kafscale.cluster.layout import layout
from kafscale.cluster.membership import BrokerRecord
from kafscale.cluster.placement import GROUP_SLOTS, group_slot
from kafscale.cluster.topics import TopicRegistry
from kafscale.storage.embedded_store import EmbeddedStore


@pytest.fixture
async def meta(tmp_path: Path) -> AsyncIterator[EmbeddedStore]:
    s = EmbeddedStore(tmp_path / "meta.sqlite", fsync=False)
    yield s
    await s.close()


async def test_moves_bump_leader_epochs_and_a_stale_move_is_skipped(meta: EmbeddedStore) -> None:
    await TopicRegistry(meta).create("t", 3, [0, 1])
    infos = await store.topics(meta)
    placed = store.partition_assignment(infos)
    p0 = placed[("t", 0)]
    other = 1 - p0
    done = await store.write_moves(meta, [Move(("t", 0), p0, other), Move(("t", 1), 7, other)])  # the 2nd is stale
    assert done == [Move(("t", 0), p0, other)]
    info = (await store.topics(meta))["t"]
    assert (info.placement[0], info.leader_epochs) == (other, [1, 0, 0])
    await store.ensure_group_slots(meta, [0, 1])
    await store.ensure_group_slots(meta, [5])  # written once: a later call changes nothing
    slots = await store.group_slots(meta)
    assert slots is not None and len(slots) == GROUP_SLOTS and set(slots) == {0, 1}
    assert await store.write_moves(meta, [Move(("", 3), slots[3], 5)]) == [Move(("", 3), slots[3], 5)]
    assert (await store.group_slots(meta) or [])[3] == 5


async def test_shard_ids_are_never_reused(meta: EmbeddedStore) -> None:
    assert [await store.allocate_shard_id(meta) for _ in range(3)] == [0, 1, 2]


async def test_the_layout_shows_nodes_shards_partitions_and_groups_even_of_a_shard_that_is_gone(
        meta: EmbeddedStore) -> None:
    await store.want(meta, store.WantedShard(0, "node-a", "10.0.0.1", 0, "10.0.0.1", 9092))
    await store.want(meta, store.WantedShard(1, "node-b", "10.0.0.2", 0, "10.0.0.2", 9092))
    await meta.put(keys.broker(0), asdict(BrokerRecord(0, "10.0.0.1", 9092, node_id="node-a", node_ip="10.0.0.1")))
    await TopicRegistry(meta).create("t", 2, [0, 1])
    await store.ensure_group_slots(meta, [0, 1])
    await meta.put(keys.group("g/1"), {"generation": 1})
    await store.set_draining(meta, {1})
    nodes = {n["node_ip"]: n["shards"] for n in (await layout(meta))["nodes"]}
    assert set(nodes) == {"10.0.0.1", "10.0.0.2"}
    a, b = nodes["10.0.0.1"][0], nodes["10.0.0.2"][0]
    assert (a["live"], b["live"], a["draining"], b["draining"]) == (True, False, False, True)
    assert sorted(a["partitions"] + b["partitions"]) == ["t-0", "t-1"]
    assert len(a["group_slots"]) + len(b["group_slots"]) == GROUP_SLOTS
    owner = a if group_slot("g/1") in a["group_slots"] else b
    assert owner["groups"] == ["g/1"]


async def test_a_physical_partitions_virtual_partitions_are_placed_and_moved_together(meta: EmbeddedStore) -> None:
    info = await TopicRegistry(meta).create("v", 12, [0, 1, 2], physical=3)
    assert info.units == 3 and info.lanes(1) == [1, 4, 7, 10] and info.unit_of(10) == 1
    assert all(info.placement[p] == info.placement[p % 3] for p in range(12))
    assert set(info.placement[:3]) == {0, 1, 2}
    placed = store.partition_assignment(await store.topics(meta))
    assert placed == {("v", u): info.placement[u] for u in range(3)}  # what moves: the physical partitions
    source = info.placement[1]
    target = next(s for s in (0, 1, 2) if s != source)
    assert await store.write_moves(meta, [Move(("v", 1), source, target)]) == [Move(("v", 1), source, target)]
    moved = (await store.topics(meta))["v"]
    assert [moved.placement[p] for p in (1, 4, 7, 10)] == [target] * 4
    assert [moved.leader_epochs[p] for p in range(12)] == [1 if p % 3 == 1 else 0 for p in range(12)]
    assert [moved.placement[p] for p in range(12) if p % 3 != 1] == [info.placement[p] for p in range(12) if p % 3 != 1]


async def test_a_move_naming_a_virtual_partition_moves_its_physical_partition(meta: EmbeddedStore) -> None:
    info = await TopicRegistry(meta).create("v", 6, [0, 1], physical=2)
    source = info.placement[1]
    target = 1 - source
    assert await store.write_moves(meta, [Move(("v", 5), source, target)]) == [Move(("v", 5), source, target)]
    moved = (await store.topics(meta))["v"]
    assert [moved.placement[p] for p in (1, 3, 5)] == [target] * 3
    assert [moved.placement[p] for p in (0, 2, 4)] == [info.placement[0]] * 3
