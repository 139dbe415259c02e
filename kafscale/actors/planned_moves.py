"""Planned moves, as the controller runs them: hand-offs, and the commands that ask for them.

A hand-off: the source shard flushes, commits and lets go (ShardCore.release), then placement names the target,
which opens at a higher epoch with the producer state its predecessor committed. A source that cannot be
reached, or takes longer than RELEASE_TIMEOUT_S, is fenced by the target's new epoch instead. The decisions
(which moves) are kafscale.cluster.assign's; autoscaling (kafscale.actors.scaler) hands off the same way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kafscale.cluster import placement_store as store
from kafscale.cluster.assign import Move, balance, drain
from kafscale.storage.metadata_store import MetadataStore

log = logging.getLogger(__name__)
RELEASE_TIMEOUT_S = 15.0

HandOff = Callable[[list[Move]], Awaitable[list[dict[str, Any]]]]


async def hand_off(meta: MetadataStore, moves: list[Move], release: Mapping[int, Any],
                   slots: asyncio.Semaphore) -> list[dict[str, Any]]:
    """Every move, at most `slots` at once. release: live shard id -> its actor's `release` method."""

    async def one(m: Move) -> dict[str, Any]:
        async with slots:
            started = time.monotonic()
            topic, partition = m.item  # type: ignore[misc]
            if topic and m.source in release:
                try:
                    await asyncio.wait_for(release[m.source].remote(topic, partition), RELEASE_TIMEOUT_S)
                except Exception as e:
                    log.warning("controller: shard %d did not release %s-%d (%s); fencing it instead",
                                m.source, topic, partition, e)
            written = await store.write_moves(meta, [m])
            return {"topic": topic or None, "partition": partition if topic else None,
                    "group_slot": None if topic else partition, "from": m.source, "to": m.target,
                    "moved": bool(written), "seconds": round(time.monotonic() - started, 3)}

    return list(await asyncio.gather(*(one(m) for m in moves)))


async def move_partition(meta: MetadataStore, topic: str, partition: int, target: int,
                         hand_off: HandOff) -> dict[str, Any]:
    """`kafscale partition move`: one partition to a live shard."""
    info = (await store.topics(meta)).get(topic)
    if info is None or not 0 <= partition < info.partitions:
        raise ValueError(f"no partition {topic}-{partition}")
    if target not in await store.live_shards(meta):
        raise ValueError(f"shard {target} is not live")
    partition = info.unit_of(partition)  # a virtual partition moves with its physical partition's others
    source = info.placement[partition]
    if source == target:
        return {"topic": topic, "partition": partition, "from": source, "to": target, "moved": False, "seconds": 0.0}
    return (await hand_off([Move((topic, partition), source, target)]))[0]


async def rebalance(meta: MetadataStore, hand_off: HandOff) -> list[dict[str, Any]]:
    """`kafscale cluster rebalance`: partitions and group slots even over the live shards (drained ones included
    again: a drained node that stayed up is back in use)."""
    await store.set_draining(meta, set())
    live = sorted(await store.live_shards(meta))
    moves = (balance(store.partition_assignment(await store.topics(meta)), live)
             + balance(store.slot_assignment(await store.group_slots(meta)), live))
    return await hand_off(moves)


async def drain_node(meta: MetadataStore, node: str, hand_off: HandOff) -> list[dict[str, Any]]:
    """`kafscale cluster drain`: everything off the shards of a node (by IP or node id prefix)."""
    live = await store.live_shards(meta)
    leaving = {s for s, b in live.items()
               if node in (b.node_ip, b.host) or (len(node) >= 6 and b.node_id.startswith(node))}
    if not leaving:
        raise ValueError(f"no live shard on node {node}")
    drained = await store.draining(meta)
    remaining = [s for s in live if s not in leaving and s not in drained]
    if not remaining:
        raise ValueError(f"node {node} runs every live shard that is not drained: there is nowhere to move its work")
    return await drain_shards(meta, leaving, remaining, hand_off)


async def drain_shards(meta: MetadataStore, leaving: set[int], remaining: list[int],
                       hand_off: HandOff) -> list[dict[str, Any]]:
    """Everything on the leaving shards to the remaining ones (a node's drain, an autoscaled shard's removal)."""
    # First: nothing new lands there (new topics, healing) while its work moves off.
    await store.set_draining(meta, await store.draining(meta) | leaving)
    moves = (drain(store.partition_assignment(await store.topics(meta)), leaving, remaining)
             + drain(store.slot_assignment(await store.group_slots(meta)), leaving, remaining))
    return await hand_off(moves)
