"""Consumer groups with unmodified clients over TCP, on the embedded stores and on etcd + SeaweedFS.

* Three members of one group split a six-partition topic two partitions each and, while the group is stable,
  consume 30,000 records exactly once between them (confluent-kafka, kafka-python, aiokafka).
* Membership changes (a fourth member joins, one leaves cleanly, one is killed with SIGKILL and found by
  session expiry): after each, every partition has exactly one owner and consumption goes on from the
  committed offsets without skipping a record (confluent-kafka members in their own processes).
* Cooperative-sticky (incremental) rebalancing with confluent-kafka: a joining member takes partitions over
  without the others giving up the ones they keep.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupState, Producer
from confluent_kafka.admin import AdminClient

from tests.integration.conftest import Cluster, unique_topic, wait_until

PARTITIONS = 6
RECORDS = 30_000
SESSION_MS, HEARTBEAT_MS = 6000, 1000
CLIENTS = ["confluent-kafka", "kafka-python", "aiokafka"]

Consumed = list[tuple[int, int, bytes]]  # (partition, offset, value)


def produce(bootstrap: str, topic: str, values: range) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    for i in values:
        producer.produce(topic, value=b"%d" % i, partition=i % PARTITIONS)
        if i % 5000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


def create_topic(cluster: Cluster, hint: str) -> str:
    topic = unique_topic(hint)
    with cluster.wire() as wire:
        wire.create_topic(topic, PARTITIONS)
    return topic


# ------------------------------------------------------------------------ three members, one group


class Members:
    """n members of one group, each polled from its own thread; the client is hidden behind three callables."""

    def __init__(self, n: int, open_consumer: Callable[[], Any], poll: Callable[[Any], Consumed],
                 assignment: Callable[[Any], set[int]], close: Callable[[Any], None]) -> None:
        self.consumed: list[Consumed] = [[] for _ in range(n)]
        self.assignments: list[set[int]] = [set() for _ in range(n)]
        self.stable_assignments: list[set[int]] = []  # as they were while the group was stable
        self.changes = 0  # assignment changes after the group first became stable
        self.stable = threading.Event()
        self.stop = threading.Event()
        self._fns = (open_consumer, poll, assignment, close)
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(n)]
        self.errors: list[BaseException] = []

    def _run(self, i: int) -> None:
        open_consumer, poll, assignment, close = self._fns
        try:
            consumer = open_consumer()
            try:
                while not self.stop.is_set():
                    self.consumed[i] += poll(consumer)
                    now = assignment(consumer)
                    if now != self.assignments[i] and self.stable.is_set():
                        self.changes += 1
                    self.assignments[i] = now
            finally:
                close(consumer)
        except BaseException as e:  # reported by the test thread
            self.errors.append(e)

    def split_evenly(self) -> bool:
        parts = [p for a in self.assignments for p in a]
        return sorted(parts) == list(range(PARTITIONS)) and all(len(a) == PARTITIONS // 3 for a in self.assignments)

    def total(self) -> int:
        return sum(len(c) for c in self.consumed)


def run_members(members: Members, bootstrap: str, topic: str) -> None:
    for t in members.threads:
        t.start()
    try:
        wait_until(lambda: members.errors or members.split_evenly(), 60, "three members with two partitions each")
        assert not members.errors, members.errors
        members.stable.set()
        produce(bootstrap, topic, range(RECORDS))
        wait_until(lambda: members.errors or members.total() >= RECORDS, 120, f"{RECORDS} records consumed")
        time.sleep(0.5)  # anything consumed twice would show up now
    finally:
        members.stable_assignments = [set(a) for a in members.assignments]
        members.stable.clear()  # members closing one by one rebalance the others: not counted
        members.stop.set()
        for t in members.threads:
            t.join(30)
    assert not members.errors, members.errors


def confluent_members(bootstrap: str, topic: str, group: str) -> Members:
    def open_consumer() -> Any:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                      "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": HEARTBEAT_MS,
                      "partition.assignment.strategy": "range"})
        c.subscribe([topic])
        return c

    def poll(c: Any) -> Consumed:
        return [(m.partition(), m.offset(), m.value()) for m in c.consume(1000, 0.1) if not m.error()]

    return Members(3, open_consumer, poll, lambda c: {tp.partition for tp in c.assignment()}, lambda c: c.close())


def kafka_python_members(bootstrap: str, topic: str, group: str) -> Members:
    from kafka import KafkaConsumer

    def open_consumer() -> Any:
        c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                          session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS, max_poll_records=2000)
        # kafka-python 3.0.12 bug: a leader that joins before it has the topic's metadata assigns nothing,
        # rejoins once the metadata arrives, and then (when a poll times out during that second join) never
        # completes it: need_rejoin() turns false as soon as it has computed the assignment, so the finished
        # join is never picked up and its heartbeats stay disabled until its session expires. Having the
        # metadata before the first poll keeps the client off that path (see docs/groups.md).
        assert c.partitions_for_topic(topic) == set(range(PARTITIONS))
        return c

    def poll(c: Any) -> Consumed:
        batches = c.poll(timeout_ms=100)
        return [(r.partition, r.offset, r.value) for records in batches.values() for r in records]

    return Members(3, open_consumer, poll, lambda c: {tp.partition for tp in c.assignment()}, lambda c: c.close())


def aiokafka_members(bootstrap: str, topic: str, group: str) -> Members:
    """aiokafka is asyncio: each member thread runs its own loop, driven one poll at a time."""
    from aiokafka import AIOKafkaConsumer

    async def start() -> Any:
        c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                             session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS, max_poll_records=2000)
        await c.start()
        return c

    def open_consumer() -> Any:
        loop = asyncio.new_event_loop()
        return loop, loop.run_until_complete(start())

    def poll(lc: Any) -> Consumed:
        loop, c = lc
        batches = loop.run_until_complete(c.getmany(timeout_ms=100))
        return [(r.partition, r.offset, r.value) for records in batches.values() for r in records]

    def close(lc: Any) -> None:
        loop, c = lc
        loop.run_until_complete(c.stop())
        loop.close()

    return Members(3, open_consumer, poll, lambda lc: {tp.partition for tp in lc[1].assignment()}, close)


MEMBERS = {"confluent-kafka": confluent_members, "kafka-python": kafka_python_members,
           "aiokafka": aiokafka_members}


@pytest.mark.parametrize("client", CLIENTS)
def test_three_members_split_six_partitions_and_consume_exactly_once(broker: Cluster, client: str) -> None:
    topic = create_topic(broker, f"groups-{client}")
    members = MEMBERS[client](broker.bootstrap, topic, f"g-{topic}")
    run_members(members, broker.bootstrap, topic)
    assert members.changes == 0, "the group rebalanced while it should have been stable"
    values = sorted(int(v) for c in members.consumed for _, _, v in c)
    assert values == list(range(RECORDS)), "records missing or consumed twice"
    for consumed, assigned in zip(members.consumed, members.stable_assignments, strict=True):
        assert {p for p, _, _ in consumed} <= assigned


# ------------------------------------------------------------------------ membership changes


WORKER = [sys.executable, "-m", "tests.integration.group_worker"]


class Worker:
    """A confluent-kafka member in its own process (so that it can be killed): it writes every record it
    consumes to its file before committing it."""

    def __init__(self, bootstrap: str, topic: str, group: str, out: Path, strategy: str = "range") -> None:
        self.out = out
        self.proc = subprocess.Popen([*WORKER, bootstrap, topic, group, str(out), strategy],
                                     cwd=Path(__file__).parents[2])

    def records(self) -> Consumed:
        if not self.out.exists():
            return []
        rows = []
        for line in self.out.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] != "revoked" and parts[0] != "assigned":
                rows.append((int(parts[0]), int(parts[1]), parts[2].encode()))
        return rows

    def events(self) -> list[tuple[str, set[int]]]:
        if not self.out.exists():
            return []
        events = []
        for line in self.out.read_text().splitlines():
            kind, _, rest = line.partition(" ")
            if kind in ("revoked", "assigned"):
                events.append((kind, {int(p) for p in rest.split(",") if p}))
        return events

    def stop(self) -> None:
        self.proc.terminate()
        assert self.proc.wait(30) == 0

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def owners(admin: AdminClient, group: str, members: int) -> dict[str, set[int]] | None:
    """Member -> partitions once the group is Stable with this many members, each partition owned once."""
    description = admin.describe_consumer_groups([group])[group].result(10)
    if description.state != ConsumerGroupState.STABLE or len(description.members) != members:
        return None
    assigned = {m.member_id: {tp.partition for tp in m.assignment.topic_partitions} for m in description.members}
    parts = sorted(p for ps in assigned.values() for p in ps)
    assert len(parts) == len(set(parts)), f"a partition has two owners: {assigned}"
    return assigned if parts == list(range(PARTITIONS)) else None


def consumed_values(workers: list[Worker]) -> set[int]:
    return {int(v) for w in workers for _, _, v in w.records()}


def test_membership_changes_keep_one_owner_per_partition_and_skip_nothing(broker: Cluster, tmp_path: Path) -> None:
    topic = create_topic(broker, "groups-churn")
    group = f"g-{topic}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    workers = [Worker(broker.bootstrap, topic, group, tmp_path / f"w{i}.txt") for i in range(3)]
    produced = 0

    def phase(members: int, what: str) -> None:
        nonlocal produced
        wait_until(lambda: owners(admin, group, members), 60, f"{what}: {members} members, one owner per partition")
        produce(broker.bootstrap, topic, range(produced, produced + 3000))
        produced += 3000
        wait_until(lambda: len(consumed_values(workers)) >= produced, 60, f"{what}: all {produced} records")

    try:
        phase(3, "start")
        workers.append(Worker(broker.bootstrap, topic, group, tmp_path / "w3.txt"))
        phase(4, "a fourth member joined")
        workers[0].stop()  # closes the consumer: LeaveGroup
        phase(3, "a member left")
        workers[1].kill()  # no LeaveGroup: the coordinator notices when its session expires
        phase(2, "a member was killed")
    finally:
        for w in workers:
            if w.proc.poll() is None:
                w.kill()
    assert consumed_values(workers) == set(range(produced)), "a record was skipped"
    # Re-deliveries happen only for what a killed or revoked member had not committed yet; never a gap.
    for p in range(PARTITIONS):
        offsets = sorted({o for w in workers for q, o, _ in w.records() if q == p})
        assert offsets == list(range(len(offsets))), f"partition {p} has a gap"


def test_cooperative_sticky_moves_only_what_changes_owner(broker: Cluster, tmp_path: Path) -> None:
    topic = create_topic(broker, "groups-coop")
    group = f"g-{topic}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    first = Worker(broker.bootstrap, topic, group, tmp_path / "a.txt", "cooperative-sticky")
    workers = [first]
    try:
        wait_until(lambda: owners(admin, group, 1), 60, "one member owning everything")
        produce(broker.bootstrap, topic, range(3000))
        wait_until(lambda: len(consumed_values(workers)) >= 3000, 60, "first records")
        workers.append(Worker(broker.bootstrap, topic, group, tmp_path / "b.txt", "cooperative-sticky"))
        final = wait_until(lambda: owners(admin, group, 2), 60, "two members, three partitions each")
        assert sorted(len(p) for p in final.values()) == [3, 3]
        produce(broker.bootstrap, topic, range(3000, 6000))
        wait_until(lambda: len(consumed_values(workers)) >= 6000, 60, "all records")
    finally:
        for w in workers:
            w.stop()
    events = first.events()
    revoked = [ps for kind, ps in events if kind == "revoked"]
    # Incremental: the first member gave up only the three partitions that moved (eager would revoke all six).
    assert revoked and all(len(ps) < PARTITIONS for ps in revoked[:-1]), events
    moved = set().union(*revoked[:-1])  # the last revocation is the close at the end
    assert len(moved) == 3, events
    second = {p for kind, ps in workers[1].events() if kind == "assigned" for p in ps}
    assert second == moved
    assert consumed_values(workers) == set(range(6000))
