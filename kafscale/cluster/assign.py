"""Where work should go: the controller's decisions as pure functions over an assignment.

An assignment maps items (a topic's partition, or a group slot) to shard ids. Each function returns the
moves that take it where it should be; the controller carries them out (kafscale.actors.controller) and
tests check the decisions without a cluster. Work is counted in items: partitions and group slots are
balanced separately, each over the same shards.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Move:
    item: Hashable  # (topic, partition), or ("", slot) for a group slot
    source: int
    target: int


def _counts(assignment: Mapping[Hashable, int], shards: Iterable[int]) -> Counter[int]:
    counts: Counter[int] = Counter({s: 0 for s in shards})
    for shard in assignment.values():
        if shard in counts:
            counts[shard] += 1
    return counts


def _topic(item: Hashable) -> Hashable:
    return item[0] if isinstance(item, tuple) else item


def _least(counts: Counter[int]) -> int:
    return min(counts, key=lambda s: (counts[s], s))


def heal(assignment: Mapping[Hashable, int], live: Iterable[int], dead: set[int] | None = None) -> list[Move]:
    """Items on dead shards (default: on any shard that is not live) go to the live shard with the fewest,
    one at a time."""
    counts = _counts(assignment, live)
    if not counts:
        return []
    moves = []
    for item, shard in sorted(assignment.items(), key=lambda kv: repr(kv[0])):
        if shard not in counts if dead is None else shard in dead:
            target = _least(counts)
            counts[target] += 1
            moves.append(Move(item, shard, target))
    return moves


def drain(assignment: Mapping[Hashable, int], leaving: set[int], remaining: Iterable[int]) -> list[Move]:
    """Everything on the leaving shards goes to the remaining ones, fewest first."""
    return heal({item: shard for item, shard in assignment.items()}, [s for s in remaining if s not in leaving])


def balance(assignment: Mapping[Hashable, int], shards: Iterable[int]) -> list[Move]:
    """The fewest moves that leave every shard within one item of every other (items on shards not
    listed move too)."""
    shards = list(shards)
    final = dict(assignment)
    for m in heal(assignment, shards):
        final[m.item] = m.target
    counts = _counts(final, shards)
    if counts:
        by_shard: dict[int, list[Hashable]] = {s: [] for s in shards}
        per_topic: dict[int, Counter[Hashable]] = {s: Counter() for s in shards}  # a topic's items per shard
        for item, shard in sorted(final.items(), key=lambda kv: repr(kv[0])):
            by_shard[shard].append(item)
            per_topic[shard][_topic(item)] += 1
        while True:
            most = max(counts, key=lambda s: (counts[s], -s))
            least = _least(counts)
            if counts[most] - counts[least] <= 1:
                break
            # Of the items there, the one whose topic is most crowded on `most` against `least`: moves also
            # spread each topic, so one busy topic does not end up on one shard.
            item = max(reversed(by_shard[most]),
                       key=lambda i: per_topic[most][_topic(i)] - per_topic[least][_topic(i)])
            by_shard[most].remove(item)
            by_shard[least].append(item)
            per_topic[most][_topic(item)] -= 1
            per_topic[least][_topic(item)] += 1
            counts[most] -= 1
            counts[least] += 1
            final[item] = least
    return [Move(item, shard, final[item]) for item, shard in sorted(assignment.items(), key=lambda kv: repr(kv[0]))
            if final[item] != shard]


def balance_by_load(assignment: Mapping[Hashable, int], loads: Mapping[Hashable, float], shards: Iterable[int],
                    max_moves: int, tolerance: float | None = None) -> list[Move]:
    """At most max_moves moves that even out the shards' measured load. loads: item -> its busy share
    (ShardLoad.partition_busy; items missing count as 0). Each item moves at most once.

    Items on shards not listed go first, hottest first, each to the least loaded shard. Then, greedily: from the
    most loaded shard, the item whose move best halves its gap to the least loaded one, never one that leaves
    the target as hot as the source was, until the gap is within `tolerance` (default: 10 % of the mean shard
    load, at least 0.05 busy: a move pauses its producers, which a smaller gap does not repay, and busy
    readings jitter about that much). An item at least as busy as the mean shard load cannot share a shard
    without making it hotter than the mean: it stays where it is and the others leave its shard (which, above
    the mean, is never the least loaded: nothing moves onto it).
    """
    shards = sorted(set(shards))
    if not shards or max_moves <= 0:
        return []
    items = sorted(assignment, key=repr)
    weight = {i: max(loads.get(i, 0.0), 0.0) for i in items}
    load = {s: 0.0 for s in shards}
    on: dict[int, list[Hashable]] = {s: [] for s in shards}
    for i in items:
        if assignment[i] in load:
            load[assignment[i]] += weight[i]
            on[assignment[i]].append(i)
    moves: list[Move] = []
    moved: set[Hashable] = set()

    def move(item: Hashable, source: int | None, target: int) -> None:
        if source is not None:
            load[source] -= weight[item]
            on[source].remove(item)
        load[target] += weight[item]
        on[target].append(item)
        moved.add(item)
        moves.append(Move(item, assignment[item], target))

    for i in sorted((i for i in items if assignment[i] not in load), key=lambda i: -weight[i])[:max_moves]:
        move(i, None, min(shards, key=lambda s: (load[s], s)))
    mean = sum(weight.values()) / len(shards)
    tol = max(0.05, 0.1 * mean) if tolerance is None else tolerance
    pinned: dict[int, Hashable] = {}  # shard -> its item that must end alone there
    for s in shards:
        top = max(on[s], key=lambda i: weight[i], default=None)
        if top is not None and weight[top] >= mean > 0:
            pinned[s] = top
    while len(moves) < max_moves:
        target = min(shards, key=lambda s: (load[s], s))  # never a pinned one: those are above the mean
        for source in sorted(shards, key=lambda s: (-load[s], s)):
            gap = load[source] - load[target]
            if gap <= tol:
                return moves
            # 0 < weight < gap: the move narrows the gap, and the target ends cooler than the source was (by more
            # than a float sum's rounding: an item as big as the gap would only swap the two loads).
            fits = [i for i in on[source]
                    if i not in moved and i != pinned.get(source) and 0 < weight[i] < gap - 1e-9]
            if fits:
                move(min(fits, key=lambda i: abs(gap / 2 - weight[i])), source, target)
                break
        else:
            break
    return moves


def pick_to_drain(loads_by_shard: Mapping[int, float], items_by_shard: Mapping[int, Collection[Hashable]],
                  node_of: Mapping[int, str] | None = None, home_node: str = "") -> int:
    """The shard to drain on scale-down. First one on the node running the fewest shards, never on `home_node`
    (the controller's) while another will do: a node left without shards is one Ray's autoscaler can release.
    Then the least loaded (its work disturbs the others least), the one with the fewest items (the fewest
    moves), the highest id (the ids in use stay low)."""
    if not loads_by_shard:
        raise ValueError("no shard to drain")
    node_of = node_of or {}
    per_node = Counter(node_of.get(s, "") for s in loads_by_shard)

    def cost(s: int) -> tuple[bool, int, float, int, int]:
        node = node_of.get(s, "")
        return (bool(home_node) and node == home_node, per_node[node], loads_by_shard[s],
                len(items_by_shard.get(s, ())), -s)

    return min(loads_by_shard, key=cost)


@dataclass(frozen=True, slots=True)
class Node:
    """An alive Ray node as the controller sees it."""

    id: str
    ip: str
    shards: int  # how many it should run


@dataclass(frozen=True, slots=True)
class ShardPlan:
    keep: dict[int, str]  # shard id -> node id (adopted shards are moved to their new node here)
    new: list[tuple[str, str, int]]  # (node id, node ip, port slot) for shards still to allocate
    forget: list[int]  # shards of nodes that are gone, with nobody to take them over


def plan_shards(nodes: list[Node], wanted: Mapping[int, tuple[str, str, int]],
                blocked: Mapping[str, set[int]] | None = None) -> ShardPlan:
    """Which shards every alive node runs. wanted: shard id -> (node id, node ip, slot) as stored.

    A node keeps its shards (surplus ones go, highest ids first). A node that needs more first adopts
    shards of dead nodes at its own address (a restarted cluster on the same hosts keeps its broker ids,
    so placement stays valid and nothing moves), then gets new ones at the lowest port slots free on its
    address: on a real cluster every node serves the same ports, and nodes sharing one address (a test
    cluster on 127.0.0.1) never collide. `blocked`: per address, the slots whose port was found taken.
    """
    alive = {n.id: n for n in nodes}
    keep: dict[int, str] = {}
    orphans = sorted(s for s, (node, _, _) in wanted.items() if node not in alive)
    forget: list[int] = []
    for node in nodes:
        mine = sorted(s for s, (n, _, _) in wanted.items() if n == node.id)
        for s in mine[:node.shards]:
            keep[s] = node.id
        forget += mine[node.shards:]
    new: list[tuple[str, str, int]] = []
    for node in nodes:
        missing = node.shards - sum(1 for n in keep.values() if n == node.id)
        for s in [s for s in orphans if wanted[s][1] == node.ip][:max(missing, 0)]:
            keep[s] = node.id
            orphans.remove(s)
            missing -= 1
        taken = {wanted[s][2] for s in keep if wanted[s][1] == node.ip} | {slot for _, ip, slot in new if ip == node.ip}
        taken |= (blocked or {}).get(node.ip, set())
        slot = 0
        for _ in range(max(missing, 0)):
            while slot in taken:
                slot += 1
            new.append((node.id, node.ip, slot))
            taken.add(slot)
    return ShardPlan(keep, new, sorted(forget + orphans))


def free_slot(used: set[int]) -> int:
    """The lowest port slot not in `used` (the slots of an address's shards, and those found taken)."""
    slot = 0
    while slot in used:
        slot += 1
    return slot
