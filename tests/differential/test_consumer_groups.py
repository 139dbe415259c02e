"""The consumer group protocol (KIP-848) against Apache Kafka 4.4.0: the same ConsumerGroupHeartbeat requests to
both, byte for byte, and their answers compared: the errors of malformed and out-of-place heartbeats; then two
members driven as a client drives them (join, rebalance, leave), never two owners of a partition after any answer,
and the stable states they reach (epochs, range assignment) with what ConsumerGroupDescribe, DescribeGroups and
ListGroups say there. Kafka computes target assignments off the request path, so states are compared once
settled, not answer by answer.

The cases give the member ids (v1 wants the client to choose them), so both brokers order members alike. Topic ids
differ between brokers: assignments are compared by topic name. Error messages are Kafka's or close; only codes are
compared. An invalid regex is not among the cases: Kafka answers it with INVALID_REGULAR_EXPRESSION (128), a code
the test's protocol library (kio 0.6.2) cannot read (tests/unit/test_consumer_group.py covers it).
"""

from __future__ import annotations

import datetime
import time
import uuid
from typing import Any

from tests.differential.groups import commit
from tests.differential.wire import DESCRIBE_GROUPS, LIST_GROUPS, Peer, Peers, code, req, sub, unique

HEARTBEAT_68, DESCRIBE_69 = 68, 69
V = 1  # ConsumerGroupHeartbeat v1: what Java 4.x and librdkafka 2.16 send


def heartbeat(peer: Peer, group: str, member: str, epoch: int, *, topics: tuple[str, ...] | None = None,
              owned: list[tuple[str, list[int]]] | None = None, rebalance_ms: int = -1, assignor: str | None = None,
              regex: str | None = None, instance: str | None = None) -> Any:
    ids = {t: topic_id(peer, t) for t, _ in owned or []}
    parts = None if owned is None else tuple(
        sub(HEARTBEAT_68, "TopicPartitions", version=V, topic_id=ids[t], partitions=tuple(ps)) for t, ps in owned)
    return peer.call(req(HEARTBEAT_68, version=V, group_id=group, member_id=member, member_epoch=epoch,
                         instance_id=instance, rack_id=None,
                         rebalance_timeout=datetime.timedelta(milliseconds=rebalance_ms),
                         subscribed_topic_names=topics, subscribed_topic_regex=regex, server_assignor=assignor,
                         topic_partitions=parts))


_IDS: dict[tuple[int, str], Any] = {}


def topic_id(peer: Peer, topic: str) -> Any:
    from tests.differential.test_fetch import topic_id as lookup
    key = (peer.port, topic)
    if key not in _IDS:
        _IDS[key] = lookup(peer, topic)
    return _IDS[key]


def names(peer: Peer, answer: Any) -> tuple[str, int, dict[str, list[int]] | None]:
    """(error, member epoch, assignment by topic name or None)."""
    assignment = None
    if answer.assignment is not None:
        by_id = {v: t for (port, t), v in _IDS.items() if port == peer.port}
        assignment = {by_id.get(tp.topic_id, str(tp.topic_id)): sorted(tp.partitions)
                      for tp in answer.assignment.topic_partitions}
    return code(answer.error_code), int(answer.member_epoch), assignment


def both(peers: Peers, step: Any) -> tuple[Any, Any]:
    return step(peers.kafka), step(peers.kafscale)


def test_malformed_and_out_of_place_heartbeats_get_kafkas_errors(peers: Peers, topic: str) -> None:
    for peer in peers:
        peer.create_ready(topic, 2)
        topic_id(peer, topic)
    group = unique("cg-bad")
    member = str(uuid.uuid4())
    cases = {
        "no rebalance timeout": dict(epoch=0, topics=(topic,), owned=[]),
        "no subscription": dict(epoch=0, rebalance_ms=5000, owned=[]),
        "no owned list": dict(epoch=0, topics=(topic,), rebalance_ms=5000),
        "empty member id": dict(member="", epoch=0, topics=(topic,), rebalance_ms=5000, owned=[]),
        "epoch below -2": dict(epoch=-3),
        "unknown assignor": dict(epoch=0, topics=(topic,), rebalance_ms=5000, owned=[], assignor="sticky"),
        "unknown group, epoch 3": dict(group=unique("cg-none"), epoch=3, owned=[]),
        "leave an unknown group": dict(group=unique("cg-none"), epoch=-1),
    }
    for name, case in cases.items():
        args = dict(case)
        g, m = args.pop("group", group), args.pop("member", member)
        for peer in peers:
            peer.coordinator(g)
        kafka, ours = both(peers, lambda p: code(heartbeat(p, g, m, **args).error_code))  # noqa: B023
        assert ours == kafka, name
    # A real member, then requests at the wrong epoch or from a stranger.
    for peer in peers:
        assert code(heartbeat(peer, group, member, 0, topics=(topic,), owned=[], rebalance_ms=5000).error_code) == \
            "NONE"
    stray = {
        "epoch ahead": dict(member=member, epoch=7, owned=[]),
        "unknown member": dict(member=str(uuid.uuid4()), epoch=1, owned=[]),
        "unknown member leaves": dict(member=str(uuid.uuid4()), epoch=-1),
    }
    for name, case in stray.items():
        args = dict(case)
        m = args.pop("member")
        kafka, ours = both(peers, lambda p: code(heartbeat(p, group, m, **args).error_code))  # noqa: B023
        assert ours == kafka, name


class Member:
    """One member as its client would run it against one broker: it heartbeats with the epoch and the partitions
    it owns, takes what an answer assigns at once (revoking what is no longer there), and rejoins on nothing."""

    def __init__(self, peer: Peer, group: str, member_id: str, topic: str) -> None:
        self.peer, self.group, self.id, self.topic = peer, group, member_id, topic
        self.epoch = 0
        self.owned: list[int] = []
        self.joined = False

    def beat(self, epoch: int | None = None) -> str:
        extra: dict[str, Any] = {}
        if not self.joined:
            extra = dict(topics=(self.topic,), rebalance_ms=5000, assignor="range")
        owned = [(self.topic, self.owned)] if self.owned else []
        answer = heartbeat(self.peer, self.group, self.id, self.epoch if epoch is None else epoch, owned=owned,
                           **extra)
        error, epoch, assignment = names(self.peer, answer)
        if error == "NONE":
            self.joined = True
            self.epoch = epoch
            if assignment is not None:
                self.owned = assignment.get(self.topic, [])
        return error


def settle(members: list[Member], done: Any, timeout: float = 30.0) -> None:
    """Heartbeat every member until `done()`, checking after each answer that no partition has two owners.
    Kafka computes target assignments off the request path (at most so often), so this waits for them."""
    deadline = time.monotonic() + timeout
    while not done():
        for m in members:
            assert m.beat() == "NONE", (m.peer.name, m.id)
            owners = [p for x in members for p in x.owned]
            assert len(owners) == len(set(owners)), (m.peer.name, [(x.id[0], x.owned) for x in members])
        assert time.monotonic() < deadline, (members[0].peer.name, [(x.id[0], x.epoch, x.owned) for x in members])
        time.sleep(0.1)


def test_members_join_and_leave_reconciling_without_double_ownership(peers: Peers, topic: str) -> None:
    """Two members through join, rebalance and leave, on each broker: the stable states they reach (epochs,
    range assignment) and what ConsumerGroupDescribe, DescribeGroups and ListGroups say there, compared."""
    group = unique("cg-two")
    a_id, b_id = "a" + uuid.uuid4().hex, "b" + uuid.uuid4().hex  # a sorts first on both brokers: range gives it 0-1
    seen: dict[str, list[Any]] = {}
    for peer in peers:
        peer.create_ready(topic, 4)
        topic_id(peer, topic)
        peer.coordinator(group)
        a, b = Member(peer, group, a_id, topic), Member(peer, group, b_id, topic)
        settle([a], lambda: a.owned == [0, 1, 2, 3])  # noqa: B023
        states = [("a alone", a.epoch)]
        settle([a, b], lambda: a.owned == [0, 1] and b.owned == [2, 3]  # noqa: B023
               and _describe(peer, group)[1] == "Stable")  # noqa: B023
        states += [("both", a.epoch, b.epoch), _describe(peer, group), _classic(peer, group), _listed(peer, group)]
        states.append(_commits_at_epochs(peer, group, topic, a, b, alone=states[0][1]))
        assert b.beat(epoch=-1) == "NONE"
        b.owned = []
        settle([a], lambda: a.owned == [0, 1, 2, 3])  # noqa: B023
        states += [("a again", a.epoch), _describe(peer, group)]
        seen[peer.name] = states
    assert seen["kafscale"] == seen["kafka"]


def _commits_at_epochs(peer: Peer, group: str, topic: str, a: Member, b: Member, alone: int) -> Any:
    """OffsetCommit v9 at member epochs other than the current one (KIP-1251, Kafka 4.3): a at the epoch it had
    alone, for a partition it kept (0) and one it gave up to b (2); a at an epoch it never had; b at the epoch before
    its current one, for a partition it got at its current one; a at its epoch, for its partition and b's."""
    def at(member: Member, epoch: int, partitions: list[int]) -> list[str]:
        answer = commit(peer, group, {(topic, p): 1 for p in partitions}, member=member.id, generation=epoch,
                        version=9)
        return [answer[(topic, p)] for p in partitions]

    return ("commits", at(a, alone, [0, 2]), at(a, a.epoch + 1, [0]), at(b, b.epoch - 1, [2]), at(a, a.epoch, [1, 2]))


def _describe(peer: Peer, group: str) -> Any:
    [g] = peer.call(req(DESCRIBE_69, version=0, group_ids=(group,), include_authorized_operations=False)).groups
    members = sorted((m.member_id[0], int(m.member_epoch), tuple(m.subscribed_topic_names),
                      tuple((t.topic_name, tuple(t.partitions)) for t in m.assignment.topic_partitions),
                      tuple((t.topic_name, tuple(t.partitions)) for t in m.target_assignment.topic_partitions))
                     for m in g.members)
    return code(g.error_code), g.group_state, int(g.group_epoch), int(g.assignment_epoch), g.assignor_name, members


def _classic(peer: Peer, group: str) -> Any:
    [g] = peer.call(req(DESCRIBE_GROUPS, groups=(group,), include_authorized_operations=False)).groups
    return code(g.error_code), g.group_state, g.protocol_type, g.protocol_data, sorted(
        (m.member_id[0], bytes(m.member_assignment)) for m in g.members)


def _listed(peer: Peer, group: str) -> Any:
    answer = peer.call(req(LIST_GROUPS, states_filter=(), types_filter=("consumer",)))
    return [(g.group_id, g.protocol_type, g.group_state, g.group_type) for g in answer.groups if g.group_id == group]


def test_a_topic_looked_up_by_id_with_an_empty_name(peers: Peers, topic: str) -> None:
    """Metadata names a topic by id and gives its name as "": how the Java client learns the topics a broker-side
    regex subscription assigned it. Both brokers answer with the topic."""
    from tests.differential.wire import METADATA

    answers = []
    for peer in peers:
        peer.create_ready(topic, 2)
        asked = sub(METADATA, "MetadataRequestTopic", name="", topic_id=topic_id(peer, topic))
        [found] = peer.call(req(METADATA, topics=(asked,), allow_auto_topic_creation=False,
                                include_topic_authorized_operations=False)).topics
        answers.append((code(found.error_code), found.name, len(found.partitions)))
    assert answers[1] == answers[0] == ("NONE", topic, 2)


def test_commits_at_an_older_member_epoch_as_kafka_accepts_them(peers: Peers, topic: str) -> None:
    """KIP-1251 (Kafka 4.3): OffsetCommit v9 at an epoch older than the member's. An epoch bump that left a's
    partitions alone (another member joined for another topic) still accepts a's commits at the epoch before; once
    a's partitions changed (b joined and took half, then left and gave it back), only the epoch of the change does.
    The epochs themselves are compared too: one bump for a member that joins with a topic nobody subscribed to, and
    one for a member that leaves with the last subscription to a topic."""
    seen: dict[str, list[Any]] = {}
    for peer in peers:
        group, other = unique("cg-epochs"), unique("other")
        peer.create_ready(topic, 4)
        peer.create_ready(other, 2)
        topic_id(peer, topic)
        topic_id(peer, other)
        peer.coordinator(group)
        a, b = Member(peer, group, "a" + uuid.uuid4().hex, topic), Member(peer, group, "b" + uuid.uuid4().hex, topic)
        c = Member(peer, group, "c" + uuid.uuid4().hex, other)
        settle([a], lambda: a.owned == [0, 1, 2, 3])  # noqa: B023
        alone = a.epoch
        deadline = time.monotonic() + 30
        while not (a.epoch > alone and c.owned == [0, 1] and _describe(peer, group)[1] == "Stable"):
            assert time.monotonic() < deadline, "the group did not settle with c"
            c.beat()
            a.beat()
        assert a.owned == [0, 1, 2, 3]
        states: list[Any] = [("epochs", alone, a.epoch, c.epoch),
                             ("unchanged", [commit(peer, group, {(topic, 0): 1}, member=a.id, generation=e, version=9)
                                            for e in (alone, a.epoch, a.epoch + 1)])]
        assert c.beat(epoch=-1) == "NONE"
        settle([a, b], lambda: a.owned == [0, 1] and b.owned == [2, 3]  # noqa: B023
               and _describe(peer, group)[1] == "Stable")  # noqa: B023
        halved = a.epoch
        assert b.beat(epoch=-1) == "NONE"
        b.owned = []
        settle([a], lambda: a.owned == [0, 1, 2, 3] and _describe(peer, group)[1] == "Stable")  # noqa: B023
        both_parts = {(topic, 0): 1, (topic, 2): 1}
        states.append(("changed", halved, a.epoch, [commit(peer, group, both_parts, member=a.id, generation=e,
                                                           version=9) for e in (alone, halved, a.epoch)]))
        seen[peer.name] = states
    assert seen["kafscale"] == seen["kafka"]
    assert seen["kafka"][1][1][0] == {(topic, 0): "NONE"}  # the case KIP-1251 is for
