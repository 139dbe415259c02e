"""The server-side assignors a member names in `group.remote.assignor`: `uniform` and `range`.

Both are pure functions of the members' subscriptions, the subscribed topics' partition counts and the previous
target assignment, and deterministic: a coordinator that reloads the group computes the same answer again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

# topic -> partitions; what one member is given
Assignment = dict[str, frozenset[int]]
# member id -> the topics it subscribes to (resolved: names and regex matches that exist)
Subscriptions = Mapping[str, frozenset[str]]
Assignor = Callable[[Subscriptions, Mapping[str, int], Mapping[str, Assignment]], dict[str, Assignment]]


def uniform(subscriptions: Subscriptions, partitions: Mapping[str, int],
            previous: Mapping[str, Assignment]) -> dict[str, Assignment]:
    """Every member gets as many partitions as the others, within one, among those of its topics; a partition stays
    with the member it had while that keeps the balance (few partitions move when a member joins or leaves)."""
    eligible: dict[tuple[str, int], list[str]] = {}
    for member in sorted(subscriptions):
        for topic in sorted(subscriptions[member]):
            for p in range(partitions.get(topic, 0)):
                eligible.setdefault((topic, p), []).append(member)
    owner: dict[tuple[str, int], str] = {}
    load = dict.fromkeys(subscriptions, 0)
    if not load:
        return {}
    # 1. Sticky: a member keeps what it had, up to its fair share (the share of the members sharing its topics).
    cap = {m: -(-_reachable(m, eligible) // max(1, _sharing(m, subscriptions))) for m in subscriptions}
    for member in sorted(previous):
        if member not in load:
            continue
        for topic in sorted(previous[member]):
            for p in sorted(previous[member][topic]):
                tp = (topic, p)
                if member in eligible.get(tp, ()) and tp not in owner and load[member] < cap[member]:
                    owner[tp] = member
                    load[member] += 1
    # 2. The rest to the least loaded member that may take it.
    for tp in sorted(eligible):
        if tp not in owner:
            member = min(eligible[tp], key=lambda m: (load[m], m))
            owner[tp] = member
            load[member] += 1
    # 3. Balance: move a partition from a member with two more than another eligible member, until none has.
    moved = True
    while moved:
        moved = False
        for tp in sorted(owner):
            current = owner[tp]
            lightest = min(eligible[tp], key=lambda m: (load[m], m))
            if load[current] > load[lightest] + 1:
                owner[tp] = lightest
                load[current] -= 1
                load[lightest] += 1
                moved = True
    return _by_member(owner, subscriptions)


def range_(subscriptions: Subscriptions, partitions: Mapping[str, int],
           previous: Mapping[str, Assignment]) -> dict[str, Assignment]:
    """Per topic, the members subscribing to it (ordered by member id) get consecutive ranges of its partitions,
    the first ones one more when they do not divide evenly: members subscribing to co-partitioned topics get the
    same partition numbers of each."""
    owner: dict[tuple[str, int], str] = {}
    topics = sorted({t for subscribed in subscriptions.values() for t in subscribed})
    for topic in topics:
        members = sorted(m for m, subscribed in subscriptions.items() if topic in subscribed)
        count = partitions.get(topic, 0)
        quota, extra = divmod(count, len(members))
        start = 0
        for i, member in enumerate(members):
            size = quota + (1 if i < extra else 0)
            for p in range(start, start + size):
                owner[(topic, p)] = member
            start += size
    return _by_member(owner, subscriptions)


ASSIGNORS: dict[str, Assignor] = {"uniform": uniform, "range": range_}


def _reachable(member: str, eligible: Mapping[tuple[str, int], list[str]]) -> int:
    return sum(1 for members in eligible.values() if member in members)


def _sharing(member: str, subscriptions: Subscriptions) -> int:
    """Members subscribing to at least one topic in common with this one (itself included)."""
    mine = subscriptions[member]
    return sum(1 for topics in subscriptions.values() if topics & mine)


def _by_member(owner: Mapping[tuple[str, int], str], subscriptions: Subscriptions) -> dict[str, Assignment]:
    grouped: dict[str, dict[str, set[int]]] = {m: {} for m in subscriptions}
    for (topic, p), member in owner.items():
        grouped[member].setdefault(topic, set()).add(p)
    return {m: {t: frozenset(ps) for t, ps in topics.items()} for m, topics in grouped.items()}
