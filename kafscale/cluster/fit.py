"""How many shards each node runs when the controller scales by load (`--autoscale`).

Each shard asks Ray for `shard_cpus`, so a node fits `floor(CPUs / shard_cpus)` of them. Shards already running
stay where they are (a move costs a hand-off, a new shard does not); the extra ones go to the nodes with the most
room, spreading them; what fits nowhere is what Ray's autoscaler must add nodes for. Fewer shards are never
taken away here: scaling down drains one chosen shard first, then the controller forgets it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Fit:
    per_node: dict[str, int]  # node id -> shards it should run
    unplaced: int  # wanted shards no alive node has room for
    capacity: int  # shards the alive nodes hold at most


def node_capacity(cpus: float | None, shard_cpus: float) -> int:
    return int((cpus or 0) // shard_cpus)


def fit_shards(desired: int, capacity: Mapping[str, int], running: Mapping[str, int]) -> Fit:
    """desired: shards wanted in all; capacity: node id -> shards it can hold; running: node id -> shards it
    runs now (nodes not in capacity are gone and count for nothing)."""
    per_node = {node: running.get(node, 0) for node in sorted(capacity)}
    missing = desired - sum(per_node.values())
    while missing > 0:
        room = {node: capacity[node] - count for node, count in per_node.items() if capacity[node] > count}
        if not room:
            break
        # The node with the most room left, then the one running fewest: a spread the same on every run.
        node = max(room, key=lambda n: (room[n], -per_node[n], n))
        per_node[node] += 1
        missing -= 1
    return Fit(per_node, max(missing, 0), sum(capacity.values()))
