"""The client side of the `group_protocols` scenario, run as a worker (`benchmarks.workers`, kind `group_joins`).

A producer thread writes `rate` records a second round-robin into every partition of the topic. Then `members`
confluent-kafka consumers join one group one at a time: each subscribes, and the next only once the group has
settled (every member holds partitions, none twice, all of them held, as evenly as they can be) and the newcomer
has consumed a record. One thread polls every member in turn, so rebalance callbacks are timed within a few ms.

From each member's callbacks (on_assign, on_revoke, on_lost) the worker rebuilds which member held each partition
when, and reports for every join (from the newcomer's subscribe() to the group settled):
- settle_s, and first_record_s (until the newcomer's first record);
- moved: partitions whose holder changed;
- unowned_partition_s: partition-seconds no member held (a partition moving is unheld from its revocation to its
  new assignment);
- records_waited: records produced into a partition while no member held it (what the group stopped for);
- paused_members and paused_member_s: members that had consumed before the join and held nothing at some moment
  of it (an eager rebalance takes every partition from every member), and for how long in total.
all_consuming_s: from the first subscribe() until the last member's first record.
"""

from __future__ import annotations

import bisect
import threading
import time
from typing import Any

SETTLE_TIMEOUT_S = 90.0


class _Member:
    def __init__(self, index: int, config: dict[str, Any], topic: str) -> None:
        from confluent_kafka import Consumer

        self.index = index
        self.consumer = Consumer(config)
        self.owned: set[int] = set()
        self.events: list[tuple[float, str, list[int]]] = []
        self.first_record: float | None = None
        self.records = 0
        self.errors: list[str] = []
        self.consumer.subscribe([topic], on_assign=self._assign, on_revoke=self._revoke, on_lost=self._lost)
        self.subscribed = time.monotonic()

    def _assign(self, _c: Any, partitions: list[Any]) -> None:
        ps = [tp.partition for tp in partitions]
        self.owned.update(ps)
        self.events.append((time.monotonic(), "assign", ps))

    def _revoke(self, _c: Any, partitions: list[Any]) -> None:
        ps = [tp.partition for tp in partitions]
        self.owned.difference_update(ps)
        self.events.append((time.monotonic(), "revoke", ps))

    def _lost(self, _c: Any, partitions: list[Any]) -> None:
        ps = [tp.partition for tp in partitions]
        self.owned.difference_update(ps)
        self.events.append((time.monotonic(), "lost", ps))

    def poll(self) -> None:
        for m in self.consumer.consume(1000, 0):
            if m.error():
                if len(self.errors) < 5:
                    self.errors.append(str(m.error()))
                continue
            self.records += 1
            if self.first_record is None:
                self.first_record = time.monotonic()


class _Load(threading.Thread):
    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: float) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
        self.topic, self.partitions, self.rate = topic, partitions, rate
        self.sent: list[list[float]] = [[] for _ in range(partitions)]
        self.failed = 0
        self.stopping = threading.Event()

    def _delivered(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.failed += 1

    def run(self) -> None:
        n, began = 0, time.monotonic()
        while not self.stopping.is_set():
            p = n % self.partitions
            self.producer.produce(self.topic, b"x" * 100, partition=p, on_delivery=self._delivered)
            self.sent[p].append(time.monotonic())
            n += 1
            self.producer.poll(0)
            ahead = began + n / self.rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)

    def stop(self) -> int:
        self.stopping.set()
        self.join(30)
        return self.producer.flush(30)


def _settled(members: list[_Member], partitions: int) -> bool:
    held = [m.owned for m in members]
    if not all(held):
        return False
    sizes = [len(h) for h in held]
    return sum(sizes) == partitions and len(set().union(*held)) == partitions and max(sizes) - min(sizes) <= 1


def _pump(members: list[_Member], done: Any, what: str, bootstrap: str, group: str) -> float:
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        for m in members:
            m.poll()
        if done():
            return time.monotonic()
        if time.monotonic() > deadline:
            held = {m.index: len(m.owned) for m in members}
            errors = {m.index: m.errors for m in members if m.errors}
            raise TimeoutError(f"{what} not within {SETTLE_TIMEOUT_S}s: partitions held {held}; errors {errors}; "
                               f"the coordinator's view: {_described(members, bootstrap, group)}")
        time.sleep(0.002)


def _described(members: list[_Member], bootstrap: str, group: str) -> str:
    """What DescribeConsumerGroups says of each member (by its index here): partitions assigned / in its target."""
    from confluent_kafka.admin import AdminClient

    try:
        ids = {m.consumer.memberid(): m.index for m in members}
        admin = AdminClient({"bootstrap.servers": bootstrap})
        d = admin.describe_consumer_groups([group])[group].result(30)
        rows = sorted((ids.get(x.member_id, x.member_id), len(x.assignment.topic_partitions),
                       len(x.target_assignment.topic_partitions) if x.target_assignment else None) for x in d.members)
        return f"state {d.state}, {len(rows)} members (index, assigned, target): {rows}"
    except Exception as e:
        return f"DescribeConsumerGroups failed: {e}"


def _holdings(members: list[_Member], partitions: int, t_end: float) -> list[list[tuple[float, float, int]]]:
    """Per partition: the (start, end, member) intervals some member held it."""
    events = sorted((ts, kind, ps, m.index) for m in members for ts, kind, ps in m.events)
    held: list[list[tuple[float, float, int]]] = [[] for _ in range(partitions)]
    open_: dict[tuple[int, int], float] = {}
    for ts, kind, ps, member in events:
        for p in ps:
            if kind == "assign":
                open_.setdefault((p, member), ts)
            else:
                start = open_.pop((p, member), None)
                if start is not None:
                    held[p].append((start, ts, member))
    for (p, member), start in open_.items():
        held[p].append((start, t_end, member))
    return held


def _unheld(intervals: list[tuple[float, float, int]], lo: float, hi: float) -> list[tuple[float, float]]:
    """The parts of [lo, hi] no interval covers."""
    gaps, at = [], lo
    for start, end, _ in sorted(intervals):
        if end <= at:
            continue
        if start > at:
            gaps.append((at, min(start, hi)))
        at = max(at, end)
        if at >= hi:
            break
    if at < hi:
        gaps.append((at, hi))
    return [(a, b) for a, b in gaps if b > a]


def _holder_at(intervals: list[tuple[float, float, int]], t: float) -> int | None:
    for start, end, member in intervals:
        if start <= t < end:
            return member
    return None


def _empty_time(member: _Member, lo: float, hi: float) -> float:
    """How long within [lo, hi] the member held nothing after having held something."""
    count, empty_since, total = 0, None, 0.0
    for ts, kind, ps in member.events:
        before = count
        count = count + len(ps) if kind == "assign" else max(0, count - len(ps))
        if before > 0 and count == 0:
            empty_since = ts
        elif before == 0 and count > 0 and empty_since is not None:
            total += max(0.0, min(ts, hi) - max(empty_since, lo))
            empty_since = None
    if empty_since is not None:
        total += max(0.0, hi - max(empty_since, lo))
    return total


def group_joins(p: dict[str, Any]) -> dict[str, Any]:
    """The figures, or {"error": ...} when a join did not settle (the harness reports it as such)."""
    try:
        return _group_joins(p)
    except TimeoutError as e:
        return {"error": str(e)}


def _group_joins(p: dict[str, Any]) -> dict[str, Any]:
    bootstrap, topic, partitions = p["bootstrap"], p["topic"], int(p["partitions"])
    count, rate = int(p["members"]), float(p["rate"])
    config = {"bootstrap.servers": bootstrap, "group.id": p["group"], "auto.offset.reset": "latest",
              **p["config"]}
    load = _Load(bootstrap, topic, partitions, rate)
    load.start()
    members: list[_Member] = []
    joins: list[dict[str, float]] = []
    try:
        time.sleep(1.0)  # the load is flowing before the first member comes
        for k in range(count):
            member = _Member(k, config, topic)
            members.append(member)
            settled = _pump(members, lambda: _settled(members, partitions), f"member {k + 1} settling", bootstrap,
                            p["group"])
            consuming = _pump(members, lambda m=member: m.first_record is not None, f"member {k + 1} consuming",
                              bootstrap, p["group"])
            joins.append({"subscribed": member.subscribed, "settled": settled, "consuming": consuming})
        t_end = time.monotonic()
    finally:
        undelivered = load.stop()
        closers = [threading.Thread(target=m.consumer.close) for m in members]
        for t in closers:
            t.start()
        for t in closers:
            t.join(60)

    held = _holdings(members, partitions, t_end)
    per_join = []
    for k, j in enumerate(joins):
        lo, hi = j["subscribed"], j["settled"]
        gaps = [_unheld(held[part], lo, hi) for part in range(partitions)]
        waited = sum(bisect.bisect_left(load.sent[part], b) - bisect.bisect_left(load.sent[part], a)
                     for part in range(partitions) for a, b in gaps[part])
        before = [m for m in members[:k] if m.first_record is not None and m.first_record < lo]
        paused = {m.index: _empty_time(m, lo, hi) for m in before}
        paused = {i: s for i, s in paused.items() if s > 0}
        per_join.append({
            "member": k + 1, "settle_s": round(hi - lo, 4), "first_record_s": round(j["consuming"] - lo, 4),
            "moved": sum(1 for part in range(partitions)
                         if _holder_at(held[part], lo) != _holder_at(held[part], hi - 1e-6)),
            "unowned_partition_s": round(sum(b - a for g in gaps for a, b in g), 3),
            "records_waited": waited, "paused_members": len(paused),
            "paused_member_s": round(sum(paused.values()), 3),
        })
    rest = per_join[1:]
    settle = sorted(j["settle_s"] for j in rest)
    return {
        "members": count, "partitions": partitions, "rate": rate, "config": p["config"],
        "all_consuming_s": round(joins[-1]["consuming"] - joins[0]["subscribed"], 3),
        "first_member_s": per_join[0]["first_record_s"],
        "join_settle_p50_s": settle[len(settle) // 2] if settle else None,
        "join_settle_max_s": settle[-1] if settle else None,
        "records_waited": sum(j["records_waited"] for j in rest),
        "unowned_partition_s": round(sum(j["unowned_partition_s"] for j in rest), 3),
        "paused_member_s": round(sum(j["paused_member_s"] for j in rest), 3),
        "paused_members": sum(j["paused_members"] for j in rest),
        "records_consumed": sum(m.records for m in members),
        "undelivered": undelivered + load.failed,
        "joins": per_join,
    }
