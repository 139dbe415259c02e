"""KIP-848's consumer group protocol through Apache Kafka's Java client 4.4.0 (group.protocol=consumer): the broker
computes the assignment (its server-side assignors, uniform and range), members heartbeat (ConsumerGroupHeartbeat)
and give a partition up before anyone else gets it.

Every case runs against Apache Kafka 4.4.0 (`[kafka]`, the kafka_reference fixture), which validates it, and against
Kafscale (`[kafscale]`, the jvm_broker of conftest.py). Each member, and the producer that keeps writing meanwhile,
is a driver JVM of its own (Driver.java's "member" and "produce_until" ops, started by harness.Driver.start), so a
member can be killed with kill -9. A member prints its rebalance callbacks and the records it read, each with the
wall-clock time, and commits what it printed after every poll; the tests rebuild from those lines who owned which
partition when:

- three members joining one at a time while a producer writes: each join ends in balanced shares, no partition is
  ever owned by two members at once (a new owner's onPartitionsAssigned comes after the old owner's
  onPartitionsRevoked), no member reads a partition it does not own, and every record written is read exactly once;
- a member that closes (its leave) hands its partitions to the others at once, well within the session timeout;
- a member killed with kill -9 keeps its partitions until its session times out, then the other gets them and goes
  on from the killed member's last commits: nothing written is skipped;
- a member stopped (SIGSTOP) past its session is fenced: the other gets its partitions after the session; resumed,
  it finds them lost (onPartitionsLost, not a revocation) and rejoins under its own member id;
- the server-side assignors named by group.remote.assignor: uniform balances two topics' partitions, range gives each
  member the same partition numbers of both topics; each partition has exactly one owner;
- a regular expression subscription, resolved by the client (java.util.regex.Pattern) or by the broker
  (SubscriptionPattern, KIP-848), picks up a matching topic created later, and never a topic that does not match;
- Kafka's kafka-consumer-groups (ConsumerGroupCommand, 4.4.0) describes the group: its offsets and lag, the members
  with their ids, client ids and assignments, its state and assignor; `--list --type consumer` lists it as a
  consumer group, and after the members closed it is Empty.

Groups get a 6 s session and a 0.5 s heartbeat interval: on Kafka through the group's own configs
(consumer.session.timeout.ms and consumer.heartbeat.interval.ms; the fixture lowers Kafka's bounds for them), on
Kafscale through the broker's settings (CONSUMER_GROUP_TIMINGS in conftest.py). With the consumer protocol the
client takes neither from its own configuration.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.jvm.harness import Driver, Live, Tools

pytestmark = pytest.mark.timeout(300)

BROKERS = ("kafka", "kafscale")
VERSION = "4.4.0"
SESSION_MS, HEARTBEAT_MS = 6000, 500
GROUP_COMMAND = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"


@dataclass
class Broker:
    name: str
    bootstrap: str


@pytest.fixture(params=BROKERS)
def broker(request: pytest.FixtureRequest) -> Broker:
    if request.param == "kafka":
        return Broker("kafka", str(request.getfixturevalue("kafka_reference").bootstrap))
    return Broker("kafscale", str(request.getfixturevalue("jvm_broker").at("PLAINTEXT")))


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> Tools:
    return Tools(tmp_path_factory.mktemp("consumer-protocol-tools"))


class Group:
    """One test's group, its members and its producer, each a driver JVM; all stopped (or killed) at the end."""

    def __init__(self, broker: Broker, workdir: Path) -> None:
        self.broker, self.workdir = broker, workdir
        self.driver = Driver(VERSION)
        self.id = f"kip848-{uuid.uuid4().hex[:8]}"
        self.config = {"bootstrap.servers": broker.bootstrap}
        self.members: dict[str, Live] = {}
        self.producer: Live | None = None
        self.producer_topic = ""
        self.stopped_at: dict[str, float] = {}  # wall-clock ms at which a member's JVM had exited after stop()

    def setup(self, topics: dict[str, int], records: dict[str, int] | None = None) -> None:
        """Creates the topics (name: partitions), writes records (name: count), and on Kafka gives the group its
        session and heartbeat."""
        steps: list[dict[str, Any]] = [
            {"name": "create", "op": "create_topics",
             "topics": [{"name": t, "partitions": n} for t, n in topics.items()]},
            *({"name": f"fill-{t}", "op": "produce", "topic": t, "count": n} for t, n in (records or {}).items()),
        ]
        if self.broker.name == "kafka":
            steps.append({"name": "group-configs", "op": "alter_configs", "resource": "group", "resource_name": self.id,
                          "set": {"consumer.session.timeout.ms": SESSION_MS,
                                  "consumer.heartbeat.interval.ms": HEARTBEAT_MS}})
        run = self.driver.run(self.config, steps)
        for step in steps:
            run.ok(step["name"])
        for t in topics:
            assert run["create"]["results"][t] == "ok", run["create"]

    def member(self, name: str, subscription: dict[str, Any], **config: Any) -> Live:
        """A member subscribed as subscription says ({"topics": [...]}, {"pattern": ...} or
        {"subscription_pattern": ...}), with client.id its name."""
        step = {"op": "member", **subscription,
                "config": {"group.id": self.id, "group.protocol": "consumer", "client.id": name, **config}}
        self.members[name] = self.driver.start(self.config, [step], self.workdir, name)
        return self.members[name]

    def produce(self, topic: str, partitions: int) -> None:
        """A producer writing about 100 records a second, round-robin over the partitions, until stop_producing()."""
        step = {"op": "produce_until", "topic": topic, "partitions": partitions, "rate": 100}
        self.producer_topic = topic
        self.producer = self.driver.start(self.config, [step], self.workdir, "producer")

    def stop_producing(self) -> set[tuple[str, int]]:
        """Stops the producer; every (topic-partition, offset) it had acknowledged."""
        assert self.producer is not None
        [result] = self.producer.stop()
        assert "error" not in result, {k: v for k, v in result.items() if k != "acked"}
        return {(f"{self.producer_topic}-{p}", o) for p, offsets in result["acked"].items() for o in offsets}

    def stop(self, name: str) -> dict[str, Any]:
        """Closes the member (it leaves the group); its step's result."""
        [result] = self.members[name].stop()
        self.stopped_at[name] = time.time() * 1000
        assert "error" not in result, f"{name}: {result}\n{self.log()}"
        return result

    def close(self) -> None:
        for live in [*self.members.values(), *([self.producer] if self.producer else [])]:
            if live.alive():
                try:
                    live.stop(30)
                except AssertionError:
                    live.kill()

    # ---------------------------------------------------------------------------------------- what they did

    def assignments(self, *names: str) -> dict[str, set[str]]:
        """Each named member's assignment as its last poll left it."""
        out = {}
        for name in names:
            changes = self.members[name].events("assignment")
            out[name] = set(changes[-1]["partitions"]) if changes else set()
        return out

    def shares(self, *names: str, partitions: set[str]) -> list[int] | None:
        """The sizes of the named members' assignments, smallest first, when together they own exactly these
        partitions, each once; else None."""
        held = self.assignments(*names).values()
        owned = [p for each in held for p in each]
        if len(owned) != len(set(owned)) or set(owned) != partitions:
            return None
        return sorted(len(each) for each in held)

    def consumed(self, *names: str) -> Counter[tuple[str, int]]:
        """How often each (topic-partition, offset) was read, by the named members (all without names)."""
        read: Counter[tuple[str, int]] = Counter()
        for name in names or self.members:
            for batch in self.members[name].events("records"):
                read.update((tp, o) for tp, offsets in batch["records"].items() for o in offsets)
        return read

    def wait(self, what: str, condition: Callable[[], Any], timeout: float = 60) -> Any:
        """Polls condition until it is true; fails naming what was awaited, with the members' logs, when time runs out
        or a member's JVM ends that was neither stopped nor killed (its error, e.g. an UnsupportedVersionException)."""
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            for name, live in self.members.items():
                if not live.alive() and live.killed_at is None and name not in self.stopped_at:
                    raise AssertionError(f"{self.broker.name}: member {name} ended while waiting for {what}\n"
                                         f"{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.broker.name}: {what}: not within {timeout:.0f}s\n{self.log()}")
            time.sleep(0.2)

    def log(self) -> str:
        """Each member's rebalance events and the tail of its output; the producer's tail."""
        parts = []
        for name, live in self.members.items():
            events = [e for e in live.events() if e["event"] != "records"]
            parts.append(f"=== member {name}: {len(events)} events besides records:\n"
                         + "\n".join(map(str, events[-40:])) + "\n" + live.log(3000))
        if self.producer is not None:
            parts.append("=== producer\n" + self.producer.log(1500))
        return "\n".join(parts)


@pytest.fixture
def group(broker: Broker, tmp_path: Path) -> Iterator[Group]:
    g = Group(broker, tmp_path)
    try:
        yield g
    finally:
        g.close()


# ------------------------------------------------------------------------------------------------- ownership


Span = tuple[float, float, str]  # [from, until] in wall-clock ms, and the member


def ownership(g: Group) -> dict[str, list[Span]]:
    """Per partition, when each member owned it: from its onPartitionsAssigned to its onPartitionsRevoked (or
    onPartitionsLost); a partition still held at the end is held until the member was killed or its JVM exited."""
    spans: dict[str, list[Span]] = defaultdict(list)
    for name, live in g.members.items():
        held: dict[str, float] = {}
        for e in live.events():
            if e["event"] == "assigned":
                for p in e["partitions"]:
                    assert p not in held, f"{name} was assigned {p} twice without a revocation in between:\n{g.log()}"
                    held[p] = e["t"]
            elif e["event"] in ("revoked", "lost"):
                for p in e["partitions"]:
                    assert p in held, f"{name} gave up {p}, which it was not assigned:\n{g.log()}"
                    spans[p].append((held.pop(p), e["t"], name))
        end = live.killed_at or g.stopped_at.get(name) or time.time() * 1000
        for p, t in held.items():
            spans[p].append((t, end, name))
    return spans


def assert_one_owner_at_a_time(g: Group) -> dict[str, list[Span]]:
    """No partition was owned by two members at once: sorted by start, each owner's span begins no earlier than every
    earlier span ended (the old owner's revocation callback ran before the new owner's assignment callback)."""
    spans = ownership(g)
    for p, each in spans.items():
        each.sort()
        for i, (start, _, name) in enumerate(each[1:], 1):
            before = max(each[:i], key=lambda s: s[1])
            assert start >= before[1], (f"{g.broker.name}: {p} was assigned to {name} at {start:.0f}, before "
                                        f"{before[2]} gave it up at {before[1]:.0f}: {each}\n{g.log()}")
    return spans


def assert_read_only_what_owned(g: Group, spans: dict[str, list[Span]]) -> None:
    """Every batch a member read came from a partition it owned when poll returned it."""
    for name, live in g.members.items():
        for batch in live.events("records"):
            for p in batch["records"]:
                assert any(s <= batch["t"] <= e for s, e, who in spans.get(p, []) if who == name), (
                    f"{g.broker.name}: {name} read {p} at {batch['t']} outside its ownership {spans.get(p)}\n{g.log()}")


def partitions_of(topic: str, n: int) -> set[str]:
    return {f"{topic}-{p}" for p in range(n)}


def assigned_at(live: Live, partition: str) -> float:
    """When the member was last assigned the partition (its onPartitionsAssigned)."""
    return max(e["t"] for e in live.events("assigned") if partition in e["partitions"])


def assigned_since(live: Live, partition: str, since: float) -> float:
    """When the member was first assigned the partition at or after since (infinity: never)."""
    return min((e["t"] for e in live.events("assigned") if partition in e["partitions"] and e["t"] >= since),
               default=float("inf"))


# ------------------------------------------------------------------------------------------------- the cases


def test_members_joining_one_at_a_time_under_load_share_fairly_never_at_once_and_read_everything_once(
        group: Group) -> None:
    g, topic = group, f"kip848-join-{uuid.uuid4().hex[:8]}"
    everything = partitions_of(topic, 6)
    g.setup({topic: 6})
    g.produce(topic, 6)
    g.member("a", {"topics": [topic]})
    g.wait("a owns all six partitions", lambda: g.shares("a", partitions=everything) == [6])
    g.wait("a reads what the producer writes", lambda: len(g.consumed("a")) >= 50)
    g.member("b", {"topics": [topic]})
    g.wait("a and b own three partitions each", lambda: g.shares("a", "b", partitions=everything) == [3, 3])
    g.member("c", {"topics": [topic]})
    g.wait("a, b and c own two partitions each", lambda: g.shares("a", "b", "c", partitions=everything) == [2, 2, 2])
    g.wait("c reads its partitions", lambda: {tp for tp, _ in g.consumed("c")} >= g.assignments("c")["c"])
    written = g.stop_producing()
    g.wait(f"all {len(written)} records written are read", lambda: written <= set(g.consumed()))
    for name in ("a", "b", "c"):
        g.stop(name)

    spans = assert_one_owner_at_a_time(g)
    moved = {p for p, each in spans.items() if len({who for _, _, who in each}) > 1}
    assert len(moved) >= 4, spans  # b took three of a's, c one of a's and one of b's: the checks saw hand-offs
    assert_read_only_what_owned(g, spans)
    twice = {k: n for k, n in g.consumed().items() if n > 1}
    assert not twice, f"{g.broker.name}: read more than once: {sorted(twice)[:20]}\n{g.log()}"


def test_a_member_that_closes_hands_its_partitions_to_the_others_at_once(group: Group) -> None:
    g, topic = group, f"kip848-leave-{uuid.uuid4().hex[:8]}"
    everything = partitions_of(topic, 6)
    g.setup({topic: 6})
    g.produce(topic, 6)
    for name in ("a", "b", "c"):
        g.member(name, {"topics": [topic]})
    g.wait("a, b and c own two partitions each", lambda: g.shares("a", "b", "c", partitions=everything) == [2, 2, 2])
    g.wait("c reads its partitions", lambda: {tp for tp, _ in g.consumed("c")} >= g.assignments("c")["c"])
    given_up = g.assignments("c")["c"]
    g.stop("c")
    g.wait("a and b own three partitions each", lambda: g.shares("a", "b", partitions=everything) == [3, 3])
    written = g.stop_producing()
    g.wait(f"all {len(written)} records written are read", lambda: written <= set(g.consumed()))
    g.stop("a")
    g.stop("b")

    [revoked] = [e for e in g.members["c"].events("revoked") if set(e["partitions"]) == given_up]
    for p in given_up:  # the leave moves them at once; a broker that ignored it would wait out the session
        taken = min(assigned_since(g.members[n], p, assigned_at(g.members["c"], p)) for n in ("a", "b"))
        assert revoked["t"] <= taken < revoked["t"] + SESSION_MS / 2, (
            f"{g.broker.name}: {p} revoked by c at {revoked['t']}, assigned at {taken}\n{g.log()}")
    spans = assert_one_owner_at_a_time(g)
    assert_read_only_what_owned(g, spans)
    twice = {k: n for k, n in g.consumed().items() if n > 1}
    assert not twice, f"{g.broker.name}: read more than once: {sorted(twice)[:20]}\n{g.log()}"


def test_a_killed_member_s_partitions_move_after_its_session_and_reading_resumes_from_its_commits(
        group: Group) -> None:
    g, topic = group, f"kip848-kill-{uuid.uuid4().hex[:8]}"
    everything = partitions_of(topic, 6)
    g.setup({topic: 6})
    g.produce(topic, 6)
    g.member("a", {"topics": [topic]})
    g.member("b", {"topics": [topic]})
    g.wait("a and b own three partitions each", lambda: g.shares("a", "b", partitions=everything) == [3, 3])
    held = g.assignments("b")["b"]
    g.wait("b reads each of its partitions", lambda: {tp for tp, _ in g.consumed("b")} >= held)
    time.sleep(1)  # b reads and commits a while longer
    b = g.members["b"]
    b.kill()
    assert b.killed_at is not None
    g.wait("a owns all six partitions", lambda: g.shares("a", partitions=everything) == [6],
           timeout=SESSION_MS / 1000 + 30)
    written = g.stop_producing()
    g.wait(f"all {len(written)} records written are read", lambda: written <= set(g.consumed()))
    g.stop("a")

    a = g.members["a"]
    for p in held:
        moved = assigned_since(a, p, b.killed_at) - b.killed_at
        # b's last heartbeat came at most one interval (and some scheduling) before the kill
        assert SESSION_MS - 2 * HEARTBEAT_MS <= moved <= SESSION_MS + 15_000, (
            f"{g.broker.name}: {p} went to a {moved:.0f} ms after b was killed (session {SESSION_MS} ms)\n{g.log()}")
        b_batches = [sorted(batch["records"][p]) for batch in b.events("records") if p in batch["records"]]
        a_after = [o for batch in a.events("records") if batch["t"] >= b.killed_at for o in batch["records"].get(p, [])]
        # b committed every batch it printed, but perhaps not the last one: a goes on from there, or from its end
        assert b_batches[-1][0] <= min(a_after) <= b_batches[-1][-1] + 1, (
            f"{g.broker.name}: {p}: b's last batch {b_batches[-1][0]}..{b_batches[-1][-1]}, a went on at "
            f"{min(a_after)}\n{g.log()}")
    skipped = sorted(written - set(g.consumed()))
    assert not skipped, f"{g.broker.name}: never read: {skipped[:20]}"
    assert_read_only_what_owned(g, assert_one_owner_at_a_time(g))


def test_a_member_paused_past_its_session_is_fenced_finds_its_partitions_lost_and_rejoins(group: Group) -> None:
    g, topic = group, f"kip848-pause-{uuid.uuid4().hex[:8]}"
    everything = partitions_of(topic, 6)
    g.setup({topic: 6})
    g.produce(topic, 6)
    g.member("a", {"topics": [topic]})
    g.member("b", {"topics": [topic]})
    g.wait("a and b own three partitions each", lambda: g.shares("a", "b", partitions=everything) == [3, 3])
    held = g.assignments("b")["b"]
    g.wait("b reads each of its partitions", lambda: {tp for tp, _ in g.consumed("b")} >= held)
    a, b = g.members["a"], g.members["b"]
    member_id = b.events("assignment")[-1]["member_id"]
    b.pause()  # SIGSTOP: no heartbeats, but the JVM and its connections stay
    assert b.paused_at is not None
    g.wait("a owns all six partitions", lambda: g.shares("a", partitions=everything) == [6],
           timeout=SESSION_MS / 1000 + 30)
    for p in held:
        moved = assigned_since(a, p, b.paused_at) - b.paused_at
        assert SESSION_MS - 2 * HEARTBEAT_MS <= moved <= SESSION_MS + 15_000, (
            f"{g.broker.name}: {p} went to a {moved:.0f} ms after b stopped (session {SESSION_MS} ms)\n{g.log()}")
    b.resume()
    g.wait("b, fenced, rejoins and a and b own three partitions each again",
           lambda: b.events("lost") and g.shares("a", "b", partitions=everything) == [3, 3])
    written = g.stop_producing()
    g.wait(f"all {len(written)} records written are read", lambda: written <= set(g.consumed()))
    g.stop("a")
    g.stop("b")

    # the fenced member is told its partitions are lost (they were someone else's already), not asked to revoke them
    gone = [e for e in b.events() if e["event"] in ("revoked", "lost") and e["t"] >= b.paused_at]
    assert gone[0]["event"] == "lost" and set(gone[0]["partitions"]) == held, f"{g.broker.name}: {gone}\n{g.log()}"
    assert b.events("assignment")[-1]["member_id"] == member_id, g.log()  # it rejoined under its own id
    skipped = sorted(written - set(g.consumed()))
    assert not skipped, f"{g.broker.name}: never read: {skipped[:20]}"


@pytest.mark.parametrize("assignor", ["uniform", "range"])
def test_server_side_assignors_give_each_partition_one_member(group: Group, assignor: str) -> None:
    g, tag = group, uuid.uuid4().hex[:8]
    first, second = f"kip848-{assignor}-{tag}-x", f"kip848-{assignor}-{tag}-y"
    everything = partitions_of(first, 3) | partitions_of(second, 3)
    g.setup({first: 3, second: 3})
    for name in ("a", "b"):
        g.member(name, {"topics": [first, second]}, **{"group.remote.assignor": assignor})
    # uniform: balanced over all six; range: per topic, one member gets two partitions and the other one
    shares = [3, 3] if assignor == "uniform" else [2, 4]
    g.wait(f"{assignor}: a and b own {shares} partitions", lambda: g.shares("a", "b", partitions=everything) == shares)
    held = g.assignments("a", "b")
    assert held["a"].isdisjoint(held["b"]) and held["a"] | held["b"] == everything, held
    if assignor == "range":  # co-partitioned: the same partition numbers of both topics
        for name, parts in held.items():
            numbers = {t: {p.rsplit("-", 1)[1] for p in parts if p.startswith(f"{t}-")} for t in (first, second)}
            assert numbers[first] == numbers[second], f"{g.broker.name}: {name} owns {sorted(parts)}"
    g.stop("a")
    g.stop("b")
    assert_one_owner_at_a_time(g)


@pytest.mark.parametrize("subscription", ["pattern", "subscription_pattern"])
def test_a_regex_subscription_picks_up_a_topic_created_later(group: Group, subscription: str) -> None:
    g, tag = group, uuid.uuid4().hex[:8]
    first, later, unmatched = f"kip848-re-{tag}-one", f"kip848-re-{tag}-two", f"kip848-re-{tag}x-three"
    g.setup({first: 2, unmatched: 1}, records={first: 10, unmatched: 10})
    # the client matches a Pattern against the metadata it refreshes every second; the broker matches its own
    g.member("a", {subscription: f"kip848-re-{tag}-.*"}, **{"metadata.max.age.ms": 1000})
    g.wait("a owns the first topic's partitions", lambda: g.assignments("a")["a"] == partitions_of(first, 2))
    g.wait("a reads the first topic", lambda: len(g.consumed("a")) == 10)
    g.driver.run(g.config, [{"name": "create", "op": "create_topics", "topics": [{"name": later, "partitions": 2}]},
                            {"name": "fill", "op": "produce", "topic": later, "count": 10}]).ok("fill")
    g.wait("a owns both topics' partitions",
           lambda: g.assignments("a")["a"] == partitions_of(first, 2) | partitions_of(later, 2))
    g.wait("a reads the later topic too", lambda: len(g.consumed("a")) == 20)
    g.stop("a")
    owned = {p for e in g.members["a"].events("assigned") for p in e["partitions"]}
    assert not {p for p in owned if p.startswith(unmatched)}, owned
    assert {tp.rsplit("-", 1)[0] for tp, _ in g.consumed("a")} == {first, later}


def rows(stdout: str, first: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines() if line.split()[:1] == [first]]


def test_kafka_consumer_groups_describes_and_lists_the_consumer_group(group: Group, tools: Tools) -> None:
    g, topic = group, f"kip848-tool-{uuid.uuid4().hex[:8]}"
    g.setup({topic: 4}, records={topic: 40})
    for name in ("a", "b"):
        g.member(name, {"topics": [topic]}, **{"group.remote.assignor": "range"})
    g.wait("a and b own two partitions each", lambda: g.shares("a", "b", partitions=partitions_of(topic, 4)) == [2, 2])
    g.wait("all 40 records read", lambda: len(g.consumed()) == 40)
    time.sleep(1)  # the last commit lands
    held = g.assignments("a", "b")
    ids = {name: g.members[name].events("assignment")[-1]["member_id"] for name in held}
    owner = {p: name for name, parts in held.items() for p in parts}

    def tool(*args: str) -> str:
        return tools.run(GROUP_COMMAND, "--bootstrap-server", g.broker.bootstrap, *args).check().stdout

    # GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID
    offsets = tool("--describe", "--group", g.id)
    got = {f"{r[1]}-{r[2]}": r[3:] for r in rows(offsets, g.id)}
    assert sorted(got) == sorted(owner), offsets
    for p, (current, end, lag, member_id, _host, client_id) in got.items():
        assert current == end and lag == "0" and (member_id, client_id) == (ids[owner[p]], owner[p]), offsets

    # GROUP CONSUMER-ID HOST CLIENT-ID #PARTITIONS CURRENT-EPOCH CURRENT-ASSIGNMENT TARGET-EPOCH TARGET-ASSIGNMENT
    members = tool("--describe", "--group", g.id, "--members", "--verbose")
    got = {r[3]: r for r in rows(members, g.id)}
    assert sorted(got) == ["a", "b"], members
    for name, r in got.items():
        numbers = ",".join(sorted(p.rsplit("-", 1)[1] for p in held[name]))
        assert (r[1], r[4], r[6], r[8]) == (ids[name], "2", f"{topic}:{numbers}", f"{topic}:{numbers}"), members
        assert r[5] == r[7], members  # reconciled: the member is at its target epoch

    # GROUP COORDINATOR (ID) ASSIGNMENT-STRATEGY STATE #MEMBERS
    state = tool("--describe", "--group", g.id, "--state")
    [r] = rows(state, g.id)
    assert r[-3:] == ["range", "Stable", "2"], state

    listed = tool("--list", "--type", "consumer")
    assert [g.id, "Consumer"] in rows(listed, g.id), listed
    assert not rows(tool("--list", "--type", "classic"), g.id)

    g.stop("a")
    g.stop("b")
    state = tool("--describe", "--group", g.id, "--state")
    [r] = rows(state, g.id)
    assert r[-2:] == ["Empty", "0"], state
