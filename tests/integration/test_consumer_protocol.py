"""KIP-848 consumer groups (`group.protocol=consumer`: ConsumerGroupHeartbeat, server-side assignors) as
confluent-kafka (librdkafka 2.16) uses them, each case against Apache Kafka 4.4.0 and against Kafscale.

Kafscale is a real `kafscale serve` of two shards (on etcd, so the coordinator-move case can move a group slot the
way the controller does), with short consumer sessions (6 s) and heartbeats (0.5 s) from its group.consumer.*
settings. Apache Kafka keeps its defaults; each group gets the same 6 s / 0.5 s as group configs
(IncrementalAlterConfigs on the GROUP resource), which the reference broker allows by its lowered lower bounds
(kafscale.testing.kafka_reference.BASE_PROPERTIES_4).

Members are consumers in threads of this process (one in a process of its own where it is killed). Each records its
rebalance callbacks with time.monotonic(): an assignment from the moment on_assign starts, until on_revoke (which
commits first) or on_lost has finished, or the member has closed or been killed. Two members never hold one
partition at once (`double_ownership`), and every record the load produced is consumed by some member (`skipped`);
members commit what they consumed after every batch and in on_revoke, so a successor resumes where its predecessor
stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType

from kafscale.cluster import placement_store
from kafscale.cluster.assign import Move
from kafscale.cluster.placement import group_slot
from kafscale.protocol import make, request_class
from kafscale.storage.etcd_store import EtcdStore
from kafscale.testing.etcd_server import EtcdServer
from kafscale.testing.kafka_reference import ReferenceKafka
from kafscale.testing.serve_process import START_TIMEOUT_S, ServeProcess
from tests.integration.conftest import KafkaWire, unique_topic
from tests.xdist_groups import on_reference

# A start of `kafscale serve` may take START_TIMEOUT_S; the cases themselves take well under a minute each.
pytestmark = pytest.mark.timeout(START_TIMEOUT_S + 180)

SESSION_MS, HEARTBEAT_MS = 6000, 500
REPO = Path(__file__).resolve().parents[2]
FIND_COORDINATOR = 10
TP = tuple[str, int]


# ----------------------------------------------------------------------------------------------- brokers


@dataclass
class Target:
    """One broker under test: its bootstrap, and what a group needs before its first member joins."""

    name: str
    bootstrap: str
    prepare_group: Callable[[str], None]
    serve: ServeProcess | None = None
    etcd: EtcdServer | None = None
    etcd_prefix: str = ""

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap})

    def group(self, hint: str) -> str:
        group = f"{hint}-{uuid.uuid4().hex[:8]}"
        self.prepare_group(group)
        return group

    def create_topics(self, topics: dict[str, int]) -> None:
        admin = self.admin()
        futures = admin.create_topics([NewTopic(t, n, 1) for t, n in topics.items()])
        for f in futures.values():
            f.result(30)
        deadline = time.monotonic() + 30
        while True:  # every partition has a leader before anyone subscribes
            md = admin.list_topics(timeout=10).topics
            if all(t in md and len(md[t].partitions) == n and all(p.leader >= 0 for p in md[t].partitions.values())
                   for t, n in topics.items()):
                return
            assert time.monotonic() < deadline, f"topics {sorted(topics)} not ready on {self.name}"
            time.sleep(0.1)


def _kafka_group_config(kafka: ReferenceKafka) -> Callable[[str], None]:
    def prepare(group: str) -> None:
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
            ConfigEntry("consumer.session.timeout.ms", str(SESSION_MS), incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("consumer.heartbeat.interval.ms", str(HEARTBEAT_MS),
                        incremental_operation=AlterConfigOpType.SET)])
        for f in admin.incremental_alter_configs([resource]).values():
            f.result(30)

    return prepare


@pytest.fixture(scope="module")
def kafscale(tmp_path_factory: pytest.TempPathFactory, etcd_server: EtcdServer) -> Iterator[Target]:
    """`kafscale serve`, two shards, metadata in etcd (under a prefix of its own), segments in a local directory."""
    prefix = f"/kip848-{uuid.uuid4().hex[:12]}/"
    env = {"KAFSCALE_GROUP_CONSUMER_SESSION_TIMEOUT_MS": str(SESSION_MS),
           "KAFSCALE_GROUP_CONSUMER_MIN_SESSION_TIMEOUT_MS": str(SESSION_MS),
           "KAFSCALE_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS": str(HEARTBEAT_MS),
           "KAFSCALE_GROUP_CONSUMER_MIN_HEARTBEAT_INTERVAL_MS": str(HEARTBEAT_MS)}
    serve = ServeProcess(tmp_path_factory.mktemp("kip848") / "data", shards=2, env=env,
                         extra_args=["--etcd-endpoints", etcd_server.endpoint, "--etcd-prefix", prefix])
    try:
        serve.start()
        yield Target("kafscale", serve.bootstrap, lambda group: None, serve, etcd_server, prefix)
    finally:
        serve.kill()
        asyncio.run(_forget(etcd_server, prefix))


async def _forget(etcd: EtcdServer, prefix: str) -> None:
    meta = EtcdStore(etcd.endpoint, prefix=prefix)
    try:
        await meta.delete("", prefix=True)
    finally:
        await meta.close()


@pytest.fixture(scope="module", params=[pytest.param("kafka", marks=on_reference), "kafscale"])
def target(request: pytest.FixtureRequest) -> Target:
    if request.param == "kafka":
        kafka: ReferenceKafka = request.getfixturevalue("kafka_reference")
        return Target("kafka", kafka.bootstrap, _kafka_group_config(kafka))
    return request.getfixturevalue("kafscale")  # type: ignore[no-any-return]


# ------------------------------------------------------------------------------------- what members saw


@dataclass(frozen=True)
class Event:
    ts: float
    member: str
    kind: str  # assign, revoke, lost, closed (a member's end: closed, or killed)
    tps: tuple[TP, ...] = ()


@dataclass
class Ledger:
    """Every member's rebalance callbacks and records, in one timeline (time.monotonic())."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    events: list[Event] = field(default_factory=list)
    owned: dict[str, set[TP]] = field(default_factory=dict)
    consumed: dict[TP, list[tuple[int, str, float]]] = field(default_factory=dict)  # tp -> (offset, member, ts)
    errors: dict[str, list[str]] = field(default_factory=dict)
    logs: dict[str, ClientLog] = field(default_factory=dict)

    def event(self, member: str, kind: str, tps: Iterable[TP] = (), ts: float | None = None) -> None:
        with self.lock:
            tps = tuple(tps)
            self.events.append(Event(time.monotonic() if ts is None else ts, member, kind, tps))
            mine = self.owned.setdefault(member, set())
            if kind == "assign":
                mine.update(tps)
            elif kind in ("revoke", "lost"):
                mine.difference_update(tps)
            else:
                mine.clear()

    def records(self, member: str, recs: Iterable[tuple[str, int, int]], ts: float | None = None) -> None:
        ts = time.monotonic() if ts is None else ts
        with self.lock:
            for topic, partition, offset in recs:
                self.consumed.setdefault((topic, partition), []).append((offset, member, ts))

    def error(self, member: str, text: str) -> None:
        with self.lock:
            self.errors.setdefault(member, []).append(text)

    def trouble(self) -> str:
        """The errors members saw, and the end of each one's group log."""
        logs = "".join(f"\n  {name}: " + "\n    ".join(log.lines) for name, log in self.logs.items())
        return f"errors {self.errors}; client logs:{logs}"

    def owned_by(self, member: str) -> set[TP]:
        with self.lock:
            return set(self.owned.get(member, ()))

    def count(self, member: str, since: float = 0.0) -> int:
        with self.lock:
            return sum(1 for recs in self.consumed.values() for _, m, ts in recs if m == member and ts > since)

    def double_ownership(self) -> list[str]:
        """Each moment a member was given a partition another member still held."""
        with self.lock:
            events = sorted(self.events, key=lambda e: e.ts)
        holders: dict[TP, dict[str, float]] = {}
        found = []
        for e in events:
            if e.kind == "assign":
                for tp in e.tps:
                    others = {m: t for m, t in holders.setdefault(tp, {}).items() if m != e.member}
                    if others:
                        found.append(f"{tp} given to {e.member} at {e.ts:.3f} while held by {others}")
                    holders[tp][e.member] = e.ts
            elif e.kind in ("revoke", "lost"):
                for tp in e.tps:
                    holders.get(tp, {}).pop(e.member, None)
            else:
                for held in holders.values():
                    held.pop(e.member, None)
        return found

    def skipped(self, produced: dict[TP, set[int]]) -> dict[TP, list[int]]:
        with self.lock:
            seen = {tp: {o for o, _, _ in recs} for tp, recs in self.consumed.items()}
        missing = {tp: sorted(offsets - seen.get(tp, set())) for tp, offsets in produced.items()}
        return {tp: offsets[:10] for tp, offsets in missing.items() if offsets}

    def assigned_at(self, member: str, tp: TP, after: float) -> float | None:
        with self.lock:
            return next((e.ts for e in self.events if e.member == member and e.kind == "assign" and tp in e.tps
                         and e.ts > after), None)

    def first_offset(self, tp: TP, members: set[str], after: float) -> int | None:
        with self.lock:
            offsets = [o for o, m, ts in self.consumed.get(tp, ()) if m in members and ts > after]
        return min(offsets) if offsets else None


def member_config(target: Target, group: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": target.bootstrap, "group.id": group, "group.protocol": "consumer",
            "auto.offset.reset": "earliest", "enable.auto.commit": False, **extra}


class ClientLog(logging.Handler):
    """The last lines of a client's group debug log (librdkafka's `debug=cgrp`), for a failure's message: a broker
    that refuses or ignores a heartbeat often shows there only (e.g. "ConsumerGroupHeartbeatRequest not supported by
    broker" never reaches error_cb)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.lines: deque[str] = deque(maxlen=15)
        self.logger = logging.getLogger(f"rdkafka.{name}.{uuid.uuid4().hex[:6]}")
        self.logger.propagate = False
        self.logger.setLevel(logging.DEBUG)
        self.logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if any(word in text for word in ("HEARTBEAT", "COORD", "FAIL", "ERROR", "FATAL")):
            self.lines.append(text[:300])


class Member(threading.Thread):
    """A consumer in a thread: consumes, commits after every batch and in on_revoke, records everything."""

    def __init__(self, name: str, ledger: Ledger, config: dict[str, Any], topics: list[str]) -> None:
        super().__init__(name=name, daemon=True)
        self.ledger, self.topics = ledger, topics
        self.log = ledger.logs[name] = ClientLog(name)
        self.config = {**config, "error_cb": lambda e: ledger.error(name, f"error_cb {e}"), "debug": "cgrp",
                       "logger": self.log.logger}
        self.stopping = threading.Event()

    def run(self) -> None:
        consumer = Consumer(self.config)

        def tps(partitions: list[TopicPartition]) -> list[TP]:
            return [(tp.topic, tp.partition) for tp in partitions]

        def on_assign(c: Consumer, partitions: list[TopicPartition]) -> None:
            self.ledger.event(self.name, "assign", tps(partitions))

        def on_revoke(c: Consumer, partitions: list[TopicPartition]) -> None:
            self._commit(c)
            self.ledger.event(self.name, "revoke", tps(partitions))

        def on_lost(c: Consumer, partitions: list[TopicPartition]) -> None:
            self.ledger.event(self.name, "lost", tps(partitions))

        try:
            consumer.subscribe(self.topics, on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
            while not self.stopping.is_set():
                batch = consumer.consume(500, 0.1)
                good = [m for m in batch if not m.error()]
                for m in batch:
                    if m.error():
                        self.ledger.error(self.name, f"consume {m.error()}")
                if good:
                    self.ledger.records(self.name, [(m.topic(), m.partition(), m.offset()) for m in good])
                    self._commit(consumer)
        finally:
            consumer.close()  # leaves the group, revoking through on_revoke
            self.ledger.event(self.name, "closed")

    def _commit(self, consumer: Consumer) -> None:
        try:
            consumer.commit(asynchronous=False)
        except KafkaException as e:
            if e.args[0].code() != KafkaError._NO_OFFSET:  # a rebalance under way; the next commit catches up
                self.ledger.error(self.name, f"commit {e.args[0]}")

    def stop(self) -> None:
        self.stopping.set()
        self.join(60)
        assert not self.is_alive(), f"{self.name} did not close"


class RemoteMember:
    """consumer_protocol_member.py in a process of its own, its reports read into the ledger."""

    def __init__(self, name: str, ledger: Ledger, target: Target, group: str, topic: str,
                 extra: dict[str, Any] | None = None) -> None:
        self.name, self.ledger = name, ledger
        self.committed: dict[TP, int] = {}
        args = [sys.executable, "-m", "tests.integration.consumer_protocol_member", target.bootstrap, group, topic,
                json.dumps(extra or {})]
        self.proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                report = json.loads(line)
            except ValueError:
                continue  # the last line of a killed process may be cut short
            ev, ts = report["ev"], report["ts"]
            if ev in ("assign", "revoke", "lost"):
                self.ledger.event(self.name, ev, [(t, p) for t, p in report["tps"]], ts=ts)
            elif ev == "records":
                self.ledger.records(self.name, [(t, p, o) for t, p, o in report["recs"]], ts=ts)
            elif ev == "committed":
                with self.ledger.lock:
                    self.committed.update({(t, p): o for t, p, o in report["tps"]})

    def kill(self) -> float:
        """SIGKILL; returns the moment it was certainly dead, after which it holds nothing."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        dead = time.monotonic()
        self.reader.join(10)
        self.ledger.event(self.name, "closed", ts=dead)
        return dead

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class Load(threading.Thread):
    """A producer writing to every partition of its topics in turn, `rate` records a second, until stopped;
    `produced` holds each acknowledged record's offset."""

    def __init__(self, target: Target, topics: dict[str, int], rate: float = 200.0) -> None:
        super().__init__(name="load", daemon=True)
        self.tps = [(t, p) for t, n in topics.items() for p in range(n)]
        self.rate = rate
        self.producer = Producer({"bootstrap.servers": target.bootstrap, "acks": "all", "linger.ms": 5})
        self.produced: dict[TP, set[int]] = {tp: set() for tp in self.tps}
        self.failed: list[str] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        with self.lock:
            if err is not None:
                self.failed.append(str(err))
            else:
                self.produced[(msg.topic(), msg.partition())].add(msg.offset())

    def run(self) -> None:
        sent, began = 0, time.monotonic()
        while not self.stopping.is_set():
            topic, partition = self.tps[sent % len(self.tps)]
            self.producer.produce(topic, b"%d" % sent, partition=partition, on_delivery=self._delivered)
            sent += 1
            self.producer.poll(0)
            ahead = began + sent / self.rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)

    def total(self) -> int:
        with self.lock:
            return sum(len(v) for v in self.produced.values())

    def stop(self) -> dict[TP, set[int]]:
        self.stopping.set()
        self.join(30)
        assert self.producer.flush(30) == 0, "records left undelivered"
        assert not self.failed, f"the load's records failed: {self.failed[:5]}"
        with self.lock:
            return {tp: set(offsets) for tp, offsets in self.produced.items()}


@contextlib.contextmanager
def running(*things: Any) -> Iterator[None]:
    """Stop whatever is still running when the case ends (a failed assertion included)."""
    try:
        yield
    finally:
        for thing in things:
            with contextlib.suppress(Exception):
                if isinstance(thing, threading.Thread) and not thing.is_alive():
                    continue
                thing.stop()


def balanced(held: dict[str, set[TP]]) -> bool:
    sizes = [len(h) for h in held.values()]
    return max(sizes) - min(sizes) <= 1


def settle(ledger: Ledger, members: list[str], tps: set[TP], timeout: float = 40.0,
           shape: Callable[[dict[str, set[TP]]], bool] = balanced) -> dict[str, set[TP]]:
    """Wait until the members hold every partition between them, each some, none twice, in the shape the assignor
    aims at (by default: as even as can be), which a rebalance passes through on its way only at its end; their
    holdings."""
    deadline = time.monotonic() + timeout
    while True:
        held = {m: ledger.owned_by(m) for m in members}
        together = [tp for h in held.values() for tp in h]
        if all(held.values()) and len(together) == len(set(together)) and set(together) == tps and shape(held):
            return held
        if time.monotonic() > deadline:
            raise AssertionError(f"{members} did not settle on {len(tps)} partitions within {timeout}s: "
                                 f"holding {held}; {ledger.trouble()}")
        time.sleep(0.05)


def wait_consumed(ledger: Ledger, produced: dict[TP, set[int]], timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while ledger.skipped(produced):
        if time.monotonic() > deadline:
            raise AssertionError(f"records never consumed (first of each partition): {ledger.skipped(produced)}; "
                                 f"{ledger.trouble()}")
        time.sleep(0.1)


def wait_for(condition: Callable[[], Any], timeout: float, what: str, ledger: Ledger) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout}s; {ledger.trouble()}")
        time.sleep(0.05)
    return value


def partitions(topics: dict[str, int]) -> set[TP]:
    return {(t, p) for t, n in topics.items() for p in range(n)}


# ------------------------------------------------------------------------------------------------ cases


def test_members_join_and_leave_one_at_a_time_under_load(target: Target) -> None:
    """1 -> 2 -> 3 -> 2 -> 1 members while a producer writes: every record is consumed, no partition is ever held
    by two members at once, and every member consumes."""
    topic = unique_topic("kip848-joins")
    topics = {topic: 8}
    target.create_topics(topics)
    group = target.group("joins")
    ledger = Ledger()
    members = [Member(f"m{i}", ledger, member_config(target, group), [topic]) for i in (1, 2, 3)]
    load = Load(target, topics)
    with running(load, *reversed(members)):
        load.start()
        for k in range(3):
            members[k].start()
            settle(ledger, [m.name for m in members[:k + 1]], partitions(topics))
            joined = time.monotonic()
            wait_for(lambda k=k, joined=joined: ledger.count(members[k].name, since=joined) > 0, 20,
                     f"{members[k].name} consuming", ledger)
        for k in (2, 1):
            members[k].stop()
            settle(ledger, [m.name for m in members[:k]], partitions(topics))
        produced = load.stop()
        wait_consumed(ledger, produced)
        members[0].stop()
    assert ledger.double_ownership() == []
    assert ledger.skipped(produced) == {}
    assert all(ledger.count(m.name) > 0 for m in members)


def test_a_killed_members_partitions_move_after_the_session_timeout(target: Target) -> None:
    """kill -9 of a member: its partitions go to the others once its session (6 s) has run out, not before; they
    resume from its committed offsets; nothing is skipped, no partition held twice."""
    topic = unique_topic("kip848-kill")
    topics = {topic: 6}
    target.create_topics(topics)
    group = target.group("kill")
    ledger = Ledger()
    load = Load(target, topics)
    victim = RemoteMember("victim", ledger, target, group, topic)
    others = [Member(f"m{i}", ledger, member_config(target, group), [topic]) for i in (1, 2)]
    with running(load, victim, *others):
        load.start()
        wait_for(lambda: ledger.owned_by("victim"), 40, "the victim's first assignment", ledger)
        for m in others:
            m.start()
        held = settle(ledger, ["victim", "m1", "m2"], partitions(topics))
        victims = held["victim"]
        wait_for(lambda: all(victim.committed.get(tp, 0) > 0 for tp in victims), 20,
                 f"the victim committing on {sorted(victims)}", ledger)

        killed = victim.kill()
        time.sleep(1)  # a commit the victim sent just before it died is answered before the offsets are read
        admin = target.admin()
        listed = admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group, [TopicPartition(t, p) for t, p in sorted(victims)])])
        committed = {(tp.topic, tp.partition): tp.offset for tp in listed[group].result(30).topic_partitions}
        assert all(committed[tp] > 0 for tp in victims), committed

        settle(ledger, ["m1", "m2"], partitions(topics), timeout=SESSION_MS / 1000 + 30)
        for tp in victims:
            moved = min(t for t in (ledger.assigned_at(m.name, tp, killed) for m in others) if t is not None)
            assert moved - killed > SESSION_MS / 1000 - 2, f"{tp} moved {moved - killed:.2f}s after the kill"
        wait_for(lambda: all(ledger.first_offset(tp, {"m1", "m2"}, killed) is not None for tp in victims), 20,
                 "the victim's partitions consumed again", ledger)
        assert {tp: ledger.first_offset(tp, {"m1", "m2"}, killed) for tp in victims} == \
            {tp: committed[tp] for tp in victims}, "the successors did not resume from the committed offsets"

        produced = load.stop()
        wait_consumed(ledger, produced)
        for m in others:
            m.stop()
    assert ledger.double_ownership() == []
    assert ledger.skipped(produced) == {}


def find_coordinator(serve: ServeProcess, group: str) -> int:
    with KafkaWire(serve.ports[0]) as wire:
        answer = wire.call(make(request_class(FIND_COORDINATOR, 4), key_type=0, coordinator_keys=(group,)))
    [found] = answer.coordinators
    return int(found.node_id) if found.error_code == 0 else -1


async def move_group_slot(etcd: EtcdServer, prefix: str, group: str) -> tuple[int, int]:
    """What the controller's hand-off of a group slot writes (kafscale.actors.planned_moves.hand_off: a slot has
    nothing to release first): the slot map naming the other shard. Returns (from, to)."""
    meta = EtcdStore(etcd.endpoint, prefix=prefix)
    try:
        slots = await placement_store.group_slots(meta)
        assert slots is not None, "no group slot map"
        slot = group_slot(group)
        source = slots[slot]
        dest = next(s for s in sorted(set(slots)) if s != source)
        done = await placement_store.write_moves(meta, [Move(("", slot), source, dest)])
        assert done, "the slot map changed under the move"
        return source, dest
    finally:
        await meta.close()


def test_members_carry_on_through_a_coordinator_move(kafscale: Target) -> None:
    """Kafscale only: the group's slot moves to the other shard while its members consume under load; FindCoordinator
    names the new shard, both members go on consuming, nothing is skipped, no partition is held twice."""
    assert kafscale.serve is not None and kafscale.etcd is not None
    topic = unique_topic("kip848-move")
    topics = {topic: 6}
    kafscale.create_topics(topics)
    group = kafscale.group("move")
    ledger = Ledger()
    load = Load(kafscale, topics)
    members = [Member(f"m{i}", ledger, member_config(kafscale, group), [topic]) for i in (1, 2)]
    with running(load, *members):
        load.start()
        for m in members:
            m.start()
        settle(ledger, ["m1", "m2"], partitions(topics))
        before = find_coordinator(kafscale.serve, group)

        source, dest = asyncio.run(move_group_slot(kafscale.etcd, kafscale.etcd_prefix, group))
        moved = time.monotonic()
        assert before == source
        wait_for(lambda: find_coordinator(kafscale.serve, group) == dest, 20, f"shard {dest} coordinating", ledger)
        time.sleep(2 * SESSION_MS / 1000)  # past any session the old coordinator had running
        settle(ledger, ["m1", "m2"], partitions(topics))
        produced = load.stop()
        wait_consumed(ledger, produced)
        assert all(ledger.count(m.name, since=moved + SESSION_MS / 1000) > 0 for m in members), \
            "a member stopped consuming after the move"
        for m in members:
            m.stop()
    assert ledger.double_ownership() == []
    assert ledger.skipped(produced) == {}


def co_partitioned_ranges(held: set[TP], a: str, b: str) -> bool:
    """Two partitions of each topic, next to each other, the same numbers on both topics."""
    of_a, of_b = sorted(p for t, p in held if t == a), sorted(p for t, p in held if t == b)
    return of_a == of_b and len(of_a) == 2 and of_a[1] == of_a[0] + 1


@pytest.mark.parametrize("assignor", ["uniform", "range"])
def test_server_side_assignors_give_valid_assignments(target: Target, assignor: str) -> None:
    """group.remote.assignor: three members on two topics of six partitions. uniform: every member holds four;
    range: per topic, each member a contiguous range of two, the same partitions of both topics (co-partitioned).
    DescribeConsumerGroups names the assignor and the holdings the members have."""
    a, b = unique_topic(f"kip848-{assignor}-a"), unique_topic(f"kip848-{assignor}-b")
    topics = {a: 6, b: 6}
    target.create_topics(topics)
    group = target.group(assignor)
    ledger = Ledger()
    members = [Member(f"m{i}", ledger, member_config(target, group, **{"group.remote.assignor": assignor}), [a, b])
               for i in (1, 2, 3)]
    with running(*members):
        for m in members:
            m.start()
        held = settle(ledger, ["m1", "m2", "m3"], partitions(topics),
                      shape=lambda held: sorted(len(h) for h in held.values()) == [4, 4, 4] if assignor == "uniform"
                      else all(co_partitioned_ranges(h, a, b) for h in held.values()))
        admin = target.admin()  # alive until its answer came: a client destroyed first never completes its futures
        holdings = sorted(sorted(h) for h in held.values())

        def described() -> Any:
            description = admin.describe_consumer_groups([group])[group].result(30)
            got = sorted(sorted((tp.topic, tp.partition) for tp in m.assignment.topic_partitions)
                         for m in description.members)
            return description if got == holdings else None

        description = wait_for(described, 10, "DescribeConsumerGroups showing the members' holdings", ledger)
        assert description.partition_assignor == assignor
    assert ledger.double_ownership() == []


def test_an_unknown_assignor_is_the_clients_fatal_unsupported_assignor(target: Target) -> None:
    """group.remote.assignor names no assignor the broker has: UNSUPPORTED_ASSIGNOR, which librdkafka raises as a
    fatal error; the member never gets an assignment."""
    topic = unique_topic("kip848-bogus")
    target.create_topics({topic: 2})
    consumer = Consumer({**member_config(target, target.group("bogus")), "group.remote.assignor": "no-such-assignor"})
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        error = None
        while error is None and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None:
                assert msg.error() is not None, "a record came to a member the broker should have refused"
                error = msg.error()
        assert error is not None, "no error within 30 s"
        assert error.code() == KafkaError._FATAL
        assert KafkaError(KafkaError.UNSUPPORTED_ASSIGNOR).str() in error.str(), error.str()
        assert consumer.assignment() == []
    finally:
        with contextlib.suppress(KafkaException):
            consumer.close()


def test_a_regex_subscription_picks_up_a_topic_created_later(target: Target) -> None:
    """A subscription to `^prefix.*`: the matching topic is consumed; one created afterwards is assigned and consumed
    too; a topic that only contains the prefix is never assigned."""
    prefix = f"kip848re{uuid.uuid4().hex[:8]}"
    first, later, decoy = f"{prefix}a", f"{prefix}b", f"x{prefix}c"
    target.create_topics({first: 3, decoy: 1})
    group = target.group("regex")
    ledger = Ledger()
    member = Member("m1", ledger, member_config(target, group), [f"^{prefix}.*"])
    load = Load(target, {first: 3, decoy: 1}, rate=50)
    later_load = Load(target, {later: 2}, rate=50)
    with running(load, later_load, member):
        load.start()
        member.start()
        settle(ledger, ["m1"], partitions({first: 3}))
        target.create_topics({later: 2})
        later_load.start()
        settle(ledger, ["m1"], partitions({first: 3, later: 2}), timeout=60)
        produced = {**load.stop(), **later_load.stop()}
        wait_consumed(ledger, {tp: offsets for tp, offsets in produced.items() if tp[0] != decoy})
        member.stop()
    assert all(tp[0] != decoy for e in ledger.events for tp in e.tps), "the decoy topic was assigned"
