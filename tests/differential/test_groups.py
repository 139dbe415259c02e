"""The classic group protocol against Apache Kafka 4.4.0: two and three members driven with raw JoinGroup and
SyncGroup, static members (group.instance.id), the errors a member of an older generation gets, the answers of
DescribeGroups, ListGroups and OffsetDelete; then real consumers (confluent-kafka) with the range, roundrobin and
cooperative-sticky assignors.

Normalised: member ids, which each broker generates (the client id or group.instance.id, a dash and a UUID): the
format is checked, then members are named by the role the case gave them ("a", "b", "c"); the order of members
in an answer, which Kafka does not fix; and which member of a dynamic group gets which partitions, since the
assignors order members by those generated ids (the set of assignments is compared; static members are ordered
by group.instance.id, so theirs are compared member by member).
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from confluent_kafka import Consumer

from tests.differential import groups
from tests.differential.groups import commit, heartbeat, join, join_request, subscription, sync, sync_request
from tests.differential.wire import LIST_GROUPS, OFFSET_DELETE, OFFSET_FETCH, Peer, Peers, code, req, sub, unique

UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
CLIENT_ID = "kafscale-it"  # the client id KafkaWire sends


def roles(answer: Any, names: dict[str, str]) -> Any:
    """`answer` with every member id replaced by its role; ids must look like Kafka's: client id (or instance id),
    a dash, a UUID."""
    if isinstance(answer, str):
        if answer in names:
            return names[answer]
        assert not re.fullmatch(rf".+-{UUID}", answer), f"a member id the case does not know: {answer}"
        return answer
    if isinstance(answer, (list, tuple)):
        return type(answer)(roles(a, names) for a in answer)
    if isinstance(answer, dict):
        return {roles(k, names): roles(v, names) for k, v in answer.items()}
    return answer


def member_id(answer: Any, prefix: str = CLIENT_ID) -> str:
    assert re.fullmatch(rf"{re.escape(prefix)}-{UUID}", answer.member_id), answer.member_id
    return str(answer.member_id)


def joined(answer: Any) -> tuple[Any, ...]:
    """What a JoinGroup answer tells a member: error, generation, protocol, leader, and (leader only) the members
    with their metadata, by member id (Kafka lists them in no fixed order)."""
    return (code(answer.error_code), answer.generation_id, answer.protocol_name, answer.leader,
            {m.member_id: (m.group_instance_id, m.metadata) for m in answer.members})


def described(peer: Peer, group: str) -> tuple[Any, ...]:
    d = groups.describe(peer, group)
    return (code(d.error_code), d.group_state, d.protocol_type, d.protocol_data,
            {m.member_id: (m.group_instance_id, m.client_id, m.client_host, m.member_metadata, m.member_assignment)
             for m in d.members})


# ------------------------------------------------------------------------------------------- raw protocol


def second_member_round(peer: Peer, topic: str) -> Any:
    """a is Stable alone; b joins; a is told to re-join, both enter generation 2; a stays leader; then a member of
    generation 1 is stale everywhere; a leaves, b is told to rebalance; b leaves, the group is Empty."""
    group = unique("g")
    peer.coordinator(group)
    peer.create_ready(topic, 2)
    sub_a, sub_b = subscription(topic), subscription(topic, f"{topic}-b")
    first = groups.stable_member(peer, group, b"gen1-a", protocols=(("range", sub_a),))
    a = member_id(first)
    steps: dict[str, Any] = {"a-joined": joined(first)}
    with peer.connect() as other:
        pending = other.call(join_request(group, protocols=(("range", sub_b),)))
        b = member_id(pending)
        steps["b-first-join"] = code(pending.error_code)
        other.send(join_request(group, b, protocols=(("range", sub_b),)))  # waits at the barrier for a
        groups.wait_for(peer, group, "PreparingRebalance", 2)
        steps["preparing"] = described(peer, group)
        steps["a-heartbeat-preparing"] = heartbeat(peer, group, a, 1)
        steps["a-sync-preparing"] = code(sync(peer, group, a, 1, {a: b"x"}).error_code)
        steps["a-commit-preparing"] = commit(peer, group, {(topic, 0): 3}, member=a, generation=1)
        rejoined = peer.call(join_request(group, a, protocols=(("range", sub_a),)))
        _, b_joined = other.receive()
        steps["a-rejoined"], steps["b-joined"] = joined(rejoined), joined(b_joined)
        steps["completing"] = described(peer, group)
        steps["a-heartbeat-completing"] = heartbeat(peer, group, a, 2)
        steps["a-commit-completing"] = commit(peer, group, {(topic, 0): 4}, member=a, generation=2)
        other.send(sync_request(group, b, 2))
        steps["a-synced"] = sync(peer, group, a, 2, {a: b"gen2-a", b: b"gen2-b"}).assignment
        _, b_synced = other.receive()
        steps["b-synced"] = (code(b_synced.error_code), b_synced.protocol_type, b_synced.protocol_name,
                             b_synced.assignment)
        steps["stable"] = described(peer, group)
        steps["stale-generation"] = (heartbeat(peer, group, a, 1), code(sync(peer, group, a, 1).error_code),
                                     commit(peer, group, {(topic, 0): 5}, member=a, generation=1))
        steps["a-leaves"] = groups.leave(peer, group, [(a, None), ("nobody", None)])
        steps["b-after-a-left"] = heartbeat(other, group, b, 2)
        steps["b-leaves"] = groups.leave(other, group, [(b, None)])
        steps["empty"] = described(peer, group)
    return roles(steps, {a: "a", b: "b"})


def test_a_second_member_joins_and_the_first_leaves(peers: Peers, topic: str) -> None:
    got = {peer.name: second_member_round(peer, topic) for peer in peers}
    kafka = got["kafka"]
    assert kafka["a-rejoined"][:4] == ("NONE", 2, "range", "a") and kafka["b-joined"][4] == {}
    assert kafka["preparing"][1] == "PreparingRebalance" and kafka["stable"][3] == "range"
    assert kafka["stale-generation"] == ("ILLEGAL_GENERATION", "ILLEGAL_GENERATION", {(topic, 0): "ILLEGAL_GENERATION"})
    assert (kafka["a-heartbeat-preparing"], kafka["b-after-a-left"]) == ("REBALANCE_IN_PROGRESS",) * 2
    assert got["kafscale"] == kafka


def vote_round(peer: Peer) -> Any:
    """a prefers range, b and c roundrobin; all support both: the majority's choice wins."""
    group = unique("g")
    peer.coordinator(group)
    prefs = {"a": (("range", b"a"), ("roundrobin", b"a")), "b": (("roundrobin", b"b"), ("range", b"b")),
             "c": (("roundrobin", b"c"), ("range", b"c"))}
    first = groups.stable_member(peer, group, b"", protocols=prefs["a"])
    names = {member_id(first): "a"}
    with peer.connect() as b, peer.connect() as c:
        for role, conn in (("b", b), ("c", c)):
            pending = conn.call(join_request(group, protocols=prefs[role]))
            names[member_id(pending)] = role
            conn.send(join_request(group, pending.member_id, protocols=prefs[role]))
        groups.wait_for(peer, group, "PreparingRebalance", 3)
        leader = peer.call(join_request(group, first.member_id, protocols=prefs["a"]))
        answers = [joined(leader), joined(b.receive()[1]), joined(c.receive()[1])]
    return roles(answers, names)


def test_the_protocol_most_members_prefer_is_chosen(peers: Peers) -> None:
    got = {peer.name: vote_round(peer) for peer in peers}
    assert [a[2] for a in got["kafka"]] == ["roundrobin"] * 3
    assert got["kafka"][0][4] == {"a": (None, b"a"), "b": (None, b"b"), "c": (None, b"c")}
    assert got["kafscale"] == got["kafka"]


def static_round(peer: Peer, topic: str) -> Any:
    """a (static, host-a) and b (dynamic) are Stable; a restarts: a new member id, the same generation, no
    rebalance for b, the old id fenced; then a leaves by group.instance.id alone and b must rebalance."""
    group = unique("g")
    peer.coordinator(group)
    peer.create_ready(topic, 1)
    first = groups.stable_member(peer, group, b"alone", instance="host-a")
    a = member_id(first, "host-a")
    names = {a: "a"}
    steps: dict[str, Any] = {}
    with peer.connect() as other:
        pending = other.call(join_request(group))
        b = member_id(pending)
        names[b] = "b"
        other.send(join_request(group, b))
        groups.wait_for(peer, group, "PreparingRebalance", 2)
        steps["a-rejoined"] = joined(peer.call(join_request(group, a, instance="host-a")))
        steps["b-joined"] = joined(other.receive()[1])
        other.send(sync_request(group, b, 2))
        sync(peer, group, a, 2, {a: b"two-a", b: b"two-b"}, instance="host-a")
        other.receive()
        restarted = join(peer, group, instance="host-a")
        a2 = member_id(restarted, "host-a")
        names[a2] = "a2"
        steps["a-restarted"] = joined(restarted)
        steps["a2-sync"] = sync(peer, group, a2, 2, instance="host-a").assignment
        steps["b-heartbeat"] = heartbeat(other, group, b, 2)
        steps["old-a"] = (heartbeat(peer, group, a, 2, "host-a"), commit(peer, group, {(topic, 0): 1}, member=a,
                                                                            generation=2, instance="host-a"))
        steps["stable"] = described(peer, group)
        steps["a-leaves-by-instance"] = groups.leave(peer, group, [("", "host-a"), ("", "host-z")])
        steps["b-after"] = heartbeat(other, group, b, 2)
    return roles(steps, names)


def test_a_static_member_restarts_without_a_rebalance(peers: Peers, topic: str) -> None:
    got = {peer.name: static_round(peer, topic) for peer in peers}
    kafka = got["kafka"]
    assert kafka["a-restarted"][:2] == ("NONE", 2) and kafka["a2-sync"] == b"two-a"
    assert kafka["b-heartbeat"] == "NONE" and kafka["old-a"][0] == "FENCED_INSTANCE_ID"
    assert kafka["a-leaves-by-instance"] == ("NONE", ["NONE", "UNKNOWN_MEMBER_ID"])
    assert kafka["b-after"] == "REBALANCE_IN_PROGRESS"
    assert got["kafscale"] == kafka


# ------------------------------------------------------------------------- DescribeGroups, ListGroups, OffsetDelete


def offsets(peer: Peer, group: str, topic: str) -> dict[int, int]:
    answer = peer.call(req(OFFSET_FETCH, require_stable=False, groups=(sub(
        OFFSET_FETCH, "OffsetFetchRequestGroup", group_id=group, topics=(
            sub(OFFSET_FETCH, "OffsetFetchRequestTopics", name=topic, partition_indexes=(0, 1)),)),)))
    return {p.partition_index: p.committed_offset for t in answer.groups[0].topics for p in t.partitions}


def offset_delete(peer: Peer, group: str, parts: dict[str, tuple[int, ...]]) -> tuple[str, list[Any]]:
    answer = peer.call(req(OFFSET_DELETE, group_id=group, topics=tuple(
        sub(OFFSET_DELETE, "OffsetDeleteRequestTopic", name=t, partitions=tuple(
            sub(OFFSET_DELETE, "OffsetDeleteRequestPartition", partition_index=p) for p in ps))
        for t, ps in parts.items())))
    return code(answer.error_code), sorted((t.name, p.partition_index, code(p.error_code))
                                           for t in answer.topics for p in t.partitions)


def listed(peer: Peer, group: str, states: tuple[str, ...] = (), types: tuple[str, ...] = ()
           ) -> list[tuple[str, str, str]]:
    answer = peer.call(req(LIST_GROUPS, states_filter=states, types_filter=types))
    return [(g.protocol_type, g.group_state, g.group_type) for g in answer.groups if g.group_id == group]


def admin_round(peer: Peer, topic: str) -> Any:
    group, garbled = unique("g"), unique("g")
    read, other = topic, f"{topic}-other"
    peer.create_ready(read, 2)
    peer.create_ready(other, 2)
    peer.coordinator(group)
    a = member_id(groups.stable_member(peer, group, b"assigned", protocols=(("range", subscription(read)),)))
    assert set(commit(peer, group, {(read, 0): 5, (other, 0): 6, (other, 1): 7}, member=a, generation=1
                      ).values()) == {"NONE"}
    steps: dict[str, Any] = {
        "unknown": described(peer, unique("g")),
        "stable": described(peer, group),
        "listed": listed(peer, group), "listed-stable": listed(peer, group, ("Stable",)),
        "listed-empty": listed(peer, group, ("Empty",)),
        "listed-by-type": [listed(peer, group, types=types) for types in (("Classic",), ("consumer",),
                                                                          ("classic", "consumer"))],
        "delete-active": offset_delete(peer, group, {read: (0,), other: (0, 9), f"{topic}-none": (0,)}),
        "after-delete-active": (offsets(peer, group, read), offsets(peer, group, other)),
        "delete-unknown-group": offset_delete(peer, unique("g"), {read: (0,)}),
    }
    # A subscription that does not parse: the broker cannot tell what the group reads, so it reads everything.
    peer.coordinator(garbled)
    groups.stable_member(peer, garbled, b"", protocols=(("range", b"\x00\x07garbled"),))
    steps["delete-garbled"] = offset_delete(peer, garbled, {other: (0,)})
    groups.leave(peer, group, [(a, None)])
    steps["empty"] = (described(peer, group), listed(peer, group))
    steps["delete-empty"] = offset_delete(peer, group, {read: (0, 1)})
    steps["after-delete-empty"] = offsets(peer, group, read)
    return roles(steps, {a: "a"})


def test_describe_list_and_offset_delete(peers: Peers, topic: str) -> None:
    got = {peer.name: admin_round(peer, topic) for peer in peers}
    kafka = got["kafka"]
    assert kafka["unknown"] == ("NONE", "Dead", "", "", {})
    assert kafka["stable"] == ("NONE", "Stable", "consumer", "range",
                               {"a": (None, CLIENT_ID, "/127.0.0.1", subscription(topic), b"assigned")})
    assert kafka["delete-active"] == ("NONE", [(topic, 0, "GROUP_SUBSCRIBED_TO_TOPIC"), (f"{topic}-none", 0,
                                      "UNKNOWN_TOPIC_OR_PARTITION"), (f"{topic}-other", 0, "NONE"),
                                      (f"{topic}-other", 9, "UNKNOWN_TOPIC_OR_PARTITION")])
    assert kafka["after-delete-active"] == ({0: 5, 1: -1}, {0: -1, 1: 7})
    assert kafka["delete-garbled"] == ("NONE", [(f"{topic}-other", 0, "GROUP_SUBSCRIBED_TO_TOPIC")])
    assert kafka["after-delete-empty"] == {0: -1, 1: -1}
    classic = [("consumer", "Stable", "classic")]
    assert (kafka["listed"], kafka["listed-empty"], kafka["listed-by-type"]) == (classic, [], [classic, [], classic])
    assert got["kafscale"] == kafka


def test_authorized_operations_of_a_group(peers: Peers) -> None:
    """Intended difference (docs/compatibility.md): with no authorizer both answer every operation a group has;
    Kafka 4's groups also have configs (DESCRIBE_CONFIGS, ALTER_CONFIGS, KIP-848), Kafscale's do not."""
    read, delete, describe, describe_configs, alter_configs = 3, 6, 8, 10, 11
    got = {}
    for peer in peers:
        group = unique("g")
        peer.coordinator(group)
        groups.stable_member(peer, group, b"")
        answer = peer.call(req(15, groups=(group,), include_authorized_operations=True)).groups[0]
        got[peer.name] = {op for op in range(32) if answer.authorized_operations >> op & 1}
    assert got == {"kafka": {read, delete, describe, describe_configs, alter_configs},
                   "kafscale": {read, delete, describe}}


# ---------------------------------------------------------------------------------------- real consumers


def consume_assignments(bootstrap: str, group: str, topics: list[str], strategy: str,
                        instances: list[str | None]) -> dict[str, list[tuple[str, int]]]:
    """Start one consumer per entry of `instances` (a group.instance.id or None), poll them all until the group has
    handed out every partition once and nothing moved for a while; each consumer's assignment, by its name."""
    consumers = {}
    for i, instance in enumerate(instances):
        config = {"bootstrap.servers": bootstrap, "group.id": group, "partition.assignment.strategy": strategy,
                  "enable.auto.commit": False, "session.timeout.ms": 10_000, "heartbeat.interval.ms": 200,
                  "topic.metadata.refresh.interval.ms": 1000}
        if instance is not None:
            config["group.instance.id"] = instance
        consumer = Consumer(config)
        consumer.subscribe(topics)
        consumers[instance or f"member-{i}"] = consumer
    try:
        total = 3 * len(topics)  # every topic of the cases has three partitions
        deadline, last, since = time.monotonic() + 60, None, time.monotonic()
        while True:
            for consumer in consumers.values():
                consumer.poll(0.05)
            now = {name: sorted((tp.topic, tp.partition) for tp in c.assignment()) for name, c in consumers.items()}
            flat = [tp for parts in now.values() for tp in parts]
            if now != last:
                last, since = now, time.monotonic()
            elif len(flat) == len(set(flat)) == total and time.monotonic() - since > 2:
                return now
            assert time.monotonic() < deadline, f"{strategy}: no stable assignment, last {now}"
    finally:
        for consumer in consumers.values():
            consumer.close()


@pytest.mark.parametrize("strategy", ["range", "roundrobin", "cooperative-sticky"])
def test_assignments_of_two_consumers(peers: Peers, kafka_reference: Any, kafscale: Any, topic: str,
                                      strategy: str) -> None:
    """Two topics of three partitions, two consumers: range gives one member two partitions of each topic,
    roundrobin deals all six in turn. Which member gets which share depends on the ids the broker generated, so
    the shares are compared as a set. cooperative-sticky keeps what a member had before, so its shares depend on
    the order the members happened to join in: for it, both must reach a balanced assignment of every partition."""
    topics = [f"{topic}-1", f"{topic}-2"]
    got = {}
    for peer, cluster in zip(peers, (kafka_reference, kafscale), strict=True):
        for t in topics:
            peer.create_ready(t, 3)
        assigned = consume_assignments(cluster.bootstrap, unique("g"), topics, strategy, [None, None])
        got[peer.name] = sorted(assigned.values())
    one, two = topics
    expected = {
        "range": sorted([[(one, 0), (one, 1), (two, 0), (two, 1)], [(one, 2), (two, 2)]]),
        "roundrobin": sorted([[(one, 0), (one, 2), (two, 1)], [(one, 1), (two, 0), (two, 2)]]),
    }
    if strategy in expected:
        assert got["kafka"] == expected[strategy]
        assert got["kafscale"] == got["kafka"]
    else:
        assert [len(a) for a in got["kafka"]] == [len(a) for a in got["kafscale"]] == [3, 3]


def test_assignments_of_static_consumers(peers: Peers, kafka_reference: Any, kafscale: Any, topic: str) -> None:
    """Static members are ordered by group.instance.id, so each one's range assignment is the same on both."""
    got = {}
    for peer, cluster in zip(peers, (kafka_reference, kafscale), strict=True):
        peer.create_ready(topic, 3)
        got[peer.name] = consume_assignments(cluster.bootstrap, unique("g"), [topic], "range",
                                             ["host-b", "host-a", "host-c"])
    assert got["kafka"] == {"host-a": [(topic, 0)], "host-b": [(topic, 1)], "host-c": [(topic, 2)]}
    assert got["kafscale"] == got["kafka"]
