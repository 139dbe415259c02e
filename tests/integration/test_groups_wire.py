"""The group APIs over raw TCP, for what clients hide: the JoinGroup barrier, error codes they retry or swallow,
exact assignment bytes, standalone commits, the admin APIs (describe, list, delete, offset delete)."""

from __future__ import annotations

import datetime
import sys
import uuid
from typing import Any

from kafscale.protocol import make, request_class
from kafscale.protocol.errors import ErrorCode
from tests.integration.conftest import Cluster, KafkaWire, unique_topic, wait_until

JOIN, SYNC, HEARTBEAT, LEAVE = 11, 14, 12, 13
COMMIT, FETCH_OFFSETS, DESCRIBE, LIST, DELETE, OFFSET_DELETE = 8, 9, 15, 16, 42, 47
SESSION = datetime.timedelta(seconds=10)


def req(api_key: int, version: int, **fields: Any) -> Any:
    return make(request_class(api_key, version), **fields)


def sub(api_key: int, version: int, cls: str, /, **fields: Any) -> Any:
    return make(getattr(sys.modules[request_class(api_key, version).__module__], cls), **fields)


def join_request(group: str, member_id: str = "", *, version: int = 7, instance: str | None = None,
                 protocols: tuple[tuple[str, bytes], ...] = (("range", b"sub"),)) -> Any:
    return req(JOIN, version, group_id=group, session_timeout=SESSION, rebalance_timeout=SESSION,
               member_id=member_id, group_instance_id=instance, protocol_type="consumer",
               protocols=tuple(sub(JOIN, version, "JoinGroupRequestProtocol", name=n, metadata=m)
                               for n, m in protocols))


def join(wire: KafkaWire, group: str, **kw: Any) -> Any:
    """JoinGroup including the MEMBER_ID_REQUIRED round trip; returns the final answer."""
    first = wire.call(join_request(group, **kw))
    if first.error_code != ErrorCode.member_id_required:
        return first
    return wire.call(join_request(group, first.member_id, **kw))


def sync(wire: KafkaWire, group: str, member: str, generation: int, assignments: dict[str, bytes] | None = None,
         *, instance: str | None = None, protocol_name: str | None = "range") -> Any:
    return wire.call(req(SYNC, 5, group_id=group, generation_id=generation, member_id=member,
                         group_instance_id=instance, protocol_type="consumer", protocol_name=protocol_name,
                         assignments=tuple(sub(SYNC, 5, "SyncGroupRequestAssignment", member_id=m, assignment=a)
                                           for m, a in (assignments or {}).items())))


def heartbeat(wire: KafkaWire, group: str, member: str, generation: int, instance: str | None = None) -> ErrorCode:
    return wire.call(req(HEARTBEAT, 4, group_id=group, generation_id=generation, member_id=member,
                         group_instance_id=instance)).error_code


def commit(wire: KafkaWire, group: str, offsets: dict[tuple[str, int], int], *, member: str = "",
           generation: int = -1, metadata: str | None = "meta") -> dict[tuple[str, int], ErrorCode]:
    by_topic: dict[str, list[Any]] = {}
    for (t, p), o in offsets.items():
        by_topic.setdefault(t, []).append(sub(COMMIT, 8, "OffsetCommitRequestPartition", partition_index=p,
                                              committed_offset=o, committed_leader_epoch=-1,
                                              committed_metadata=metadata))
    answer = wire.call(req(COMMIT, 8, group_id=group, generation_id_or_member_epoch=generation, member_id=member,
                           group_instance_id=None, topics=tuple(
                               sub(COMMIT, 8, "OffsetCommitRequestTopic", name=t, partitions=tuple(ps))
                               for t, ps in by_topic.items())))
    return {(t.name, p.partition_index): p.error_code for t in answer.topics for p in t.partitions}


def fetch_offsets(wire: KafkaWire, groups: dict[str, list[tuple[str, int]] | None]) -> dict[str, Any]:
    """OffsetFetch v8: group -> (error, {(topic, partition): (offset, metadata)})."""
    entries = []
    for g, parts in groups.items():
        topics = None
        if parts is not None:
            by_topic: dict[str, list[int]] = {}
            for t, p in parts:
                by_topic.setdefault(t, []).append(p)
            topics = tuple(sub(FETCH_OFFSETS, 8, "OffsetFetchRequestTopics", name=t, partition_indexes=tuple(ps))
                           for t, ps in by_topic.items())
        entries.append(sub(FETCH_OFFSETS, 8, "OffsetFetchRequestGroup", group_id=g, topics=topics))
    answer = wire.call(req(FETCH_OFFSETS, 8, groups=tuple(entries), require_stable=False))
    return {g.group_id: (g.error_code, {(t.name, p.partition_index): (p.committed_offset, p.metadata)
                                        for t in g.topics for p in t.partitions}) for g in answer.groups}


def new_group() -> str:
    return f"g-{uuid.uuid4().hex[:10]}"


def test_join_barrier_waits_for_the_known_member(broker: Cluster) -> None:
    group = new_group()
    with broker.wire() as a, broker.wire() as b:
        v3 = a.call(join_request(group, version=3))
        assert v3.error_code == ErrorCode.none and v3.generation_id == 1  # no MEMBER_ID_REQUIRED before v4
        first = v3.member_id
        assert sync(a, group, first, 1, {first: b"all"}).assignment == b"all"
        pending = b.call(join_request(group))
        assert pending.error_code == ErrorCode.member_id_required
        second = pending.member_id
        b.send(join_request(group, second))  # waits at the barrier for the first member
        assert heartbeat(a, group, first, 1) == ErrorCode.rebalance_in_progress
        rejoined = a.call(join_request(group, first))
        _, answer = b.receive()
        assert rejoined.generation_id == answer.generation_id == 2
        assert rejoined.leader == answer.leader == first
        assert sorted(m.member_id for m in rejoined.members) == sorted([first, second]) and answer.members == ()
        # Exactly what the leader decided reaches each member.
        b.send(req(SYNC, 5, group_id=group, generation_id=2, member_id=second, group_instance_id=None,
                   protocol_type="consumer", protocol_name="range", assignments=()))
        mine = sync(a, group, first, 2, {first: b"\x00\x01A", second: b"\x00\x01B"})
        _, theirs = b.receive()
        assert (mine.assignment, theirs.assignment) == (b"\x00\x01A", b"\x00\x01B")
        assert theirs.protocol_type == "consumer" and theirs.protocol_name == "range"
        assert heartbeat(a, group, first, 1) == ErrorCode.illegal_generation
        assert heartbeat(a, group, "who", 2) == ErrorCode.unknown_member_id
        assert sync(a, group, first, 2, protocol_name="roundrobin").error_code == ErrorCode.inconsistent_group_protocol
        left = a.call(req(LEAVE, 4, group_id=group, members=(
            sub(LEAVE, 4, "MemberIdentity", member_id=first, group_instance_id=None),
            sub(LEAVE, 4, "MemberIdentity", member_id="nobody", group_instance_id=None))))
        assert [m.error_code for m in left.members] == [ErrorCode.none, ErrorCode.unknown_member_id]
        assert heartbeat(b, group, second, 2) == ErrorCode.rebalance_in_progress


def test_static_member_is_fenced_by_its_successor(broker: Cluster) -> None:
    group = new_group()
    with broker.wire() as wire:
        old = join(wire, group, instance="host-1")
        assert old.error_code == ErrorCode.none  # static members get no MEMBER_ID_REQUIRED
        sync(wire, group, old.member_id, old.generation_id, {old.member_id: b"A"}, instance="host-1")
        new = join(wire, group, instance="host-1")  # the same instance restarted
        assert new.member_id != old.member_id and new.generation_id == old.generation_id  # no rebalance
        assert sync(wire, group, new.member_id, new.generation_id, instance="host-1").assignment == b"A"
        assert heartbeat(wire, group, old.member_id, old.generation_id, "host-1") == ErrorCode.fenced_instance_id
        assert heartbeat(wire, group, new.member_id, new.generation_id, "host-1") == ErrorCode.none


def test_commits_and_fetches(broker: Cluster) -> None:
    topic, group, other = unique_topic("offsets"), new_group(), new_group()
    with broker.wire() as wire:
        wire.create_topic(topic, 3)
        assert set(commit(wire, group, {(topic, 0): 10, (topic, 2): 30}).values()) == {ErrorCode.none}
        assert commit(wire, group, {("no-such-topic", 0): 1}) == {
            ("no-such-topic", 0): ErrorCode.unknown_topic_or_partition}
        assert commit(wire, group, {(topic, 1): 1}, metadata="x" * 5000) == {
            (topic, 1): ErrorCode.offset_metadata_too_large}
        commit(wire, other, {(topic, 1): 7}, metadata=None)
        got = fetch_offsets(wire, {group: [(topic, 0), (topic, 1)], other: None, "never-used": [(topic, 0)]})
        assert got[group] == (ErrorCode.none, {(topic, 0): (10, "meta"), (topic, 1): (-1, "")})
        assert got[other] == (ErrorCode.none, {(topic, 1): (7, "")})  # all partitions: only what is committed
        assert got["never-used"] == (ErrorCode.none, {(topic, 0): (-1, "")})
        v1 = wire.call(req(FETCH_OFFSETS, 1, group_id=group, topics=(
            sub(FETCH_OFFSETS, 1, "OffsetFetchRequestTopic", name=topic, partition_indexes=(2,)),)))
        assert v1.topics[0].partitions[0].committed_offset == 30
        # A generation for a group that does not exist, and a member that is not one.
        assert set(commit(wire, new_group(), {(topic, 0): 1}, member="m", generation=3).values()) == {
            ErrorCode.illegal_generation}
        member = join(wire, group)
        # Standalone commits only go into a group without members.
        assert set(commit(wire, group, {(topic, 0): 11}).values()) == {ErrorCode.unknown_member_id}
        assert set(commit(wire, group, {(topic, 0): 12}, member=member.member_id,
                          generation=member.generation_id).values()) == {ErrorCode.rebalance_in_progress}
        sync(wire, group, member.member_id, member.generation_id, {member.member_id: b""})
        assert set(commit(wire, group, {(topic, 0): 12}, member=member.member_id,
                          generation=member.generation_id).values()) == {ErrorCode.none}
        assert set(commit(wire, group, {(topic, 0): 13}, member=member.member_id,
                          generation=member.generation_id - 1).values()) == {ErrorCode.illegal_generation}


def test_admin_apis(broker: Cluster) -> None:
    topic, group = unique_topic("group-admin"), new_group()
    with broker.wire() as wire:
        wire.create_topic(topic, 2)
        member = join(wire, group)
        sync(wire, group, member.member_id, member.generation_id, {member.member_id: b"assigned"})
        commit(wire, group, {(topic, 0): 5, (topic, 1): 6}, member=member.member_id,
               generation=member.generation_id)
        described = wire.call(req(DESCRIBE, 5, groups=(group, "no-such-group"),
                                  include_authorized_operations=False)).groups
        assert (described[0].group_state, described[0].protocol_type, described[0].protocol_data) == (
            "Stable", "consumer", "range")
        m = described[0].members[0]
        assert (m.member_id, m.client_id, m.client_host, m.member_metadata, m.member_assignment) == (
            member.member_id, "kafscale-it", "/127.0.0.1", b"sub", b"assigned")
        assert (described[1].error_code, described[1].group_state) == (ErrorCode.none, "Dead")
        listed = wire.call(req(LIST, 4, states_filter=("stable",))).groups
        assert any(g.group_id == group and g.group_state == "Stable" for g in listed)
        assert not any(g.group_id == group for g in wire.call(req(LIST, 4, states_filter=("Empty",))).groups)
        # Offsets of a topic an active consumer group subscribes to cannot go; the group itself neither.
        sub_topic = b"\x00\x00\x00\x00\x00\x01" + len(topic).to_bytes(2, "big") + topic.encode() + b"\xff\xff\xff\xff"
        # The member re-joins with new metadata (now subscribed to the topic): a rebalance of one.
        member2 = wire.call(join_request(group, member.member_id, protocols=(("range", sub_topic),)))
        assert member2.error_code == ErrorCode.none
        sync(wire, group, member2.member_id, member2.generation_id, {})
        deletion = wire.call(req(OFFSET_DELETE, 0, group_id=group, topics=(sub(
            OFFSET_DELETE, 0, "OffsetDeleteRequestTopic", name=topic,
            partitions=(sub(OFFSET_DELETE, 0, "OffsetDeleteRequestPartition", partition_index=0),)),)))
        assert deletion.topics[0].partitions[0].error_code == ErrorCode.group_subscribed_to_topic
        result = wire.call(req(DELETE, 2, groups_names=(group, "no-such-group"))).results
        assert [r.error_code for r in result] == [ErrorCode.non_empty_group, ErrorCode.group_id_not_found]
        wire.call(req(LEAVE, 4, group_id=group, members=(
            sub(LEAVE, 4, "MemberIdentity", member_id=member2.member_id, group_instance_id=None),)))
        deletion = wire.call(req(OFFSET_DELETE, 0, group_id=group, topics=(sub(
            OFFSET_DELETE, 0, "OffsetDeleteRequestTopic", name=topic,
            partitions=(sub(OFFSET_DELETE, 0, "OffsetDeleteRequestPartition", partition_index=0),)),)))
        assert deletion.error_code == ErrorCode.none and deletion.topics[0].partitions[0].error_code == ErrorCode.none
        assert fetch_offsets(wire, {group: None})[group] == (ErrorCode.none, {(topic, 1): (6, "meta")})
        assert wire.call(req(DELETE, 2, groups_names=(group,))).results[0].error_code == ErrorCode.none
        assert fetch_offsets(wire, {group: [(topic, 1)]})[group] == (ErrorCode.none, {(topic, 1): (-1, "")})
        assert not any(g.group_id == group for g in wire.call(req(LIST, 4, states_filter=())).groups)


def test_offsets_of_a_deleted_topic_go_with_it(broker: Cluster) -> None:
    """As in Kafka: deleting a topic deletes its committed offsets in every group, a group left Empty without
    offsets goes too, and a topic created again under the same name starts without committed offsets."""
    topic, kept = unique_topic("deleted-offsets"), unique_topic("kept-offsets")
    only_deleted, mixed = new_group(), new_group()
    with broker.wire() as wire:
        wire.create_topic(topic, 2)
        wire.create_topic(kept, 1)
        assert set(commit(wire, only_deleted, {(topic, 0): 5, (topic, 1): 6}).values()) == {ErrorCode.none}
        assert set(commit(wire, mixed, {(topic, 0): 3, (kept, 0): 1}).values()) == {ErrorCode.none}

        assert wire.delete_topics([topic]).responses[0].error_code == ErrorCode.none
        got = fetch_offsets(wire, {only_deleted: [(topic, 0), (topic, 1)], mixed: None})
        assert got[only_deleted] == (ErrorCode.none, {(topic, 0): (-1, ""), (topic, 1): (-1, "")})
        assert got[mixed] == (ErrorCode.none, {(kept, 0): (1, "meta")})  # all partitions: the deleted topic's gone

        def listed() -> set[str]:
            return {g.group_id for g in wire.call(req(LIST, 4, states_filter=())).groups}

        wait_until(lambda: only_deleted not in listed(), 10, "the group left without offsets removed")
        assert mixed in listed()

        wire.create_topic(topic, 2)  # a namesake: a new topic, no committed offsets
        got = fetch_offsets(wire, {only_deleted: [(topic, 0)], mixed: [(topic, 0), (kept, 0)]})
        assert got[only_deleted] == (ErrorCode.none, {(topic, 0): (-1, "")})
        assert got[mixed] == (ErrorCode.none, {(topic, 0): (-1, ""), (kept, 0): (1, "meta")})
