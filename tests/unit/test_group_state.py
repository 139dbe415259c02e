"""The group state machine (kafscale.groups.state) driven directly, with explicit time: Kafka's rules for
JoinGroup/SyncGroup/Heartbeat/LeaveGroup/OffsetCommit validation, barriers, sessions, static members, storage."""

from __future__ import annotations

import itertools
import struct
from typing import Any

from kafscale.groups.offsets import OffsetEntry, expired_offsets
from kafscale.groups.state import Group, GroupSettings, JoinResult, State, SyncResult
from kafscale.groups.stored import group_value, load_group
from kafscale.protocol.errors import ErrorCode

SESSION, REBALANCE = 10_000, 20_000
_tickets = itertools.count(1)


def subscription(*topics: str) -> bytes:
    body = struct.pack(">hi", 0, len(topics))
    for t in topics:
        body += struct.pack(">h", len(t)) + t.encode()
    return body + struct.pack(">i", -1)  # no user data


def join(g: Group, now: float, member_id: str = "", *, instance: str | None = None, protocols: Any = None,
         v4: bool = True, session: int = SESSION, rebalance: int = REBALANCE) -> tuple[int, JoinResult | None]:
    ticket = next(_tickets)
    result = g.join(now, ticket=ticket, member_id=member_id, instance_id=instance, client_id="c", client_host="/h",
                    session_timeout_ms=session, rebalance_timeout_ms=rebalance, protocol_type="consumer",
                    protocols=protocols or [("range", subscription("t"))], require_known_member_id=v4)
    return ticket, result


def sync(g: Group, now: float, member_id: str, generation: int, assignments: dict[str, bytes] | None = None,
         **kw: Any) -> tuple[int, SyncResult | None]:
    ticket = next(_tickets)
    result = g.sync(now, ticket=ticket, member_id=member_id, instance_id=kw.get("instance"), generation=generation,
                    protocol_type=kw.get("protocol_type"), protocol_name=kw.get("protocol_name"),
                    assignments=assignments or {})
    return ticket, result


def replies(g: Group) -> dict[int, Any]:
    out = dict(g.replies)
    g.replies.clear()
    return out


def store(g: Group, now: float, error: ErrorCode = ErrorCode.none) -> None:
    """What the coordinator does with a pending assignment: write it, then report."""
    assert g.pending_assignment is not None
    generation, assignment = g.pending_assignment
    g.assignment_stored(now, generation, assignment, error)


def stable_group(n: int, now: float = 0.0) -> tuple[Group, list[str]]:
    """n members, generation 1, Stable, member i assigned b'a<i>'."""
    g = Group("g", GroupSettings(), now)
    tickets, ids = [], []
    for _ in range(n):
        _, first = join(g, now)
        assert first is not None and first.error == ErrorCode.member_id_required
        ticket, _ = join(g, now, first.member_id)
        tickets.append(ticket)
        ids.append(first.member_id)
    # Joined one after another: the first completes generation 1 alone, the rest force generation 2.
    answers = replies(g)
    leader = g.leader
    assert leader is not None
    for m in ids:
        if g.members[m].join_ticket is None and g.state is State.PREPARING:
            t, r = join(g, now, m)
            assert r is None
            tickets.append(t)
    answers.update(replies(g))
    assert g.state is State.COMPLETING
    sync(g, now, g.leader or "", g.generation, {m: f"a{i}".encode() for i, m in enumerate(ids)})
    store(g, now)
    for m in ids:
        if m != g.leader:
            sync(g, now, m, g.generation)
    replies(g)
    assert g.state is State.STABLE
    return g, ids


def test_first_join_gets_member_id_required_then_completes_alone() -> None:
    g = Group("g", GroupSettings(), 0.0)
    _, first = join(g, 0.0)
    assert first is not None and first.error == ErrorCode.member_id_required and first.member_id.startswith("c-")
    assert g.state is State.EMPTY and first.member_id in g.pending_members
    ticket, result = join(g, 0.0, first.member_id)
    assert result is None
    answer = replies(g)[ticket]
    assert (answer.error, answer.generation, answer.leader, answer.protocol_name) == (
        ErrorCode.none, 1, first.member_id, "range")
    assert [m for m, _, _ in answer.members] == [first.member_id]
    assert g.state is State.COMPLETING


def test_v3_join_needs_no_member_id_round_trip() -> None:
    g = Group("g", GroupSettings(), 0.0)
    ticket, result = join(g, 0.0, v4=False)
    assert result is None
    assert replies(g)[ticket].generation == 1


def test_barrier_waits_for_every_known_member() -> None:
    g, (a, b) = stable_group(2)
    generation = g.generation
    _, first = join(g, 1.0)
    assert first is not None
    t_new, r = join(g, 1.0, first.member_id)
    assert r is None and g.state is State.PREPARING and not replies(g)
    # The old members learn of the rebalance from their heartbeats and re-join; only then all are answered.
    assert g.heartbeat(1.1, a, None, generation) == ErrorCode.rebalance_in_progress
    t_a, _ = join(g, 1.2, a)
    assert not replies(g)
    t_b, _ = join(g, 1.3, b)
    answers = replies(g)
    assert set(answers) == {t_new, t_a, t_b}
    assert {r.generation for r in answers.values()} == {generation + 1}
    leader_answers = [r for r in answers.values() if r.members]
    assert len(leader_answers) == 1 and leader_answers[0].member_id == g.leader
    assert len(leader_answers[0].members) == 3


def test_member_missing_the_rebalance_timeout_is_dropped() -> None:
    g, (a, b) = stable_group(2)
    _, first = join(g, 1.0)
    assert first is not None
    t_new, _ = join(g, 1.0, first.member_id)
    join(g, 1.5, a)  # b never re-joins
    assert g.next_deadline() <= 1.0 + REBALANCE / 1000
    g.expire(1.0 + REBALANCE / 1000)
    answers = replies(g)
    assert t_new in answers and b not in g.members and set(g.members) == {a, first.member_id}


def test_followers_get_exactly_what_the_leader_assigned() -> None:
    g = Group("g", GroupSettings(), 0.0)
    t1, _ = join(g, 0.0, v4=False)
    leader = replies(g)[t1].member_id
    t2, _ = join(g, 0.1, v4=False)  # second member: rebalance, leader must re-join
    t1, _ = join(g, 0.2, leader)
    answers = replies(g)
    follower = answers[t2].member_id
    ts, r = sync(g, 0.3, follower, answers[t2].generation)
    assert r is None  # waits for the leader
    tl, r = sync(g, 0.4, leader, answers[t1].generation, {leader: b"L", follower: b"F", "stranger": b"X"})
    assert r is None and g.pending_assignment is not None
    store(g, 0.5)
    answers = replies(g)
    assert (answers[tl].assignment, answers[ts].assignment) == (b"L", b"F")
    assert g.state is State.STABLE
    # A late SyncGroup in the Stable group gets the stored assignment again.
    _, again = sync(g, 0.6, follower, g.generation)
    assert again is not None and again.assignment == b"F"


def test_failed_assignment_write_sends_members_back_to_rejoin() -> None:
    g = Group("g", GroupSettings(), 0.0)
    t1, _ = join(g, 0.0, v4=False)
    leader = replies(g)[t1].member_id
    ts, _ = sync(g, 0.1, leader, 1, {leader: b"L"})
    store(g, 0.2, ErrorCode.coordinator_not_available)
    assert replies(g)[ts].error == ErrorCode.coordinator_not_available
    assert g.state is State.PREPARING


def test_sync_checks_generation_member_and_protocol() -> None:
    g, (a, _) = stable_group(2)
    assert sync(g, 1, a, g.generation + 1)[1].error == ErrorCode.illegal_generation  # type: ignore[union-attr]
    assert sync(g, 1, "nobody", g.generation)[1].error == ErrorCode.unknown_member_id  # type: ignore[union-attr]
    wrong_type = sync(g, 1, a, g.generation, protocol_type="connect")[1]
    wrong_name = sync(g, 1, a, g.generation, protocol_type="consumer", protocol_name="roundrobin")[1]
    assert wrong_type is not None and wrong_type.error == ErrorCode.inconsistent_group_protocol
    assert wrong_name is not None and wrong_name.error == ErrorCode.inconsistent_group_protocol
    ok = sync(g, 1, a, g.generation, protocol_type="consumer", protocol_name="range")[1]
    assert ok is not None and ok.error == ErrorCode.none and ok.protocol_name == "range"


def test_heartbeat_errors() -> None:
    g, (a, _) = stable_group(2)
    assert g.heartbeat(1, a, None, g.generation) == ErrorCode.none
    assert g.heartbeat(1, a, None, g.generation - 1) == ErrorCode.illegal_generation
    assert g.heartbeat(1, "nobody", None, g.generation) == ErrorCode.unknown_member_id


def test_session_expiry_removes_the_member_and_rebalances() -> None:
    g, (a, _) = stable_group(2)
    g.heartbeat(5.0, a, None, g.generation)
    g.expire(SESSION / 1000 + 0.01)  # b's session (from its sync at 0) is over, a's is not
    assert set(g.members) == {a} and g.state is State.PREPARING
    t, _ = join(g, 11.0, a)
    assert replies(g)[t].generation == 3


def test_members_waiting_in_a_rebalance_do_not_expire() -> None:
    g, (a, b) = stable_group(2)
    join(g, 1.0, a)  # a waits at the barrier for b
    g.heartbeat(9.0, b, None, g.generation)
    g.expire(SESSION / 1000 + 1.5)
    assert a in g.members


def test_protocol_selection_and_inconsistent_protocols() -> None:
    g = Group("g", GroupSettings(), 0.0)
    both = [("cooperative-sticky", b"c"), ("range", b"r")]
    t1, _ = join(g, 0, v4=False, protocols=both)
    leader = replies(g)[t1].member_id
    join(g, 0, v4=False, protocols=[("range", b"r2")])
    join(g, 0, leader, protocols=both)
    answers = replies(g)
    assert {r.protocol_name for r in answers.values()} == {"range"}  # the only protocol every member supports
    _, bad = join(g, 1, v4=False, protocols=[("roundrobin", b"x")])
    assert bad is not None and bad.error == ErrorCode.inconsistent_group_protocol


def test_invalid_session_timeout() -> None:
    g = Group("g", GroupSettings(min_session_timeout_ms=6000), 0.0)
    _, r = join(g, 0, session=1000)
    assert r is not None and r.error == ErrorCode.invalid_session_timeout


def test_static_member_rejoin_keeps_assignment_and_fences_the_old_id() -> None:
    g = Group("g", GroupSettings(), 0.0)
    t, _ = join(g, 0, instance="i1")
    old = replies(g)[t].member_id
    assert old.startswith("i1-")
    sync(g, 0.1, old, 1, {old: b"A"})
    store(g, 0.2)
    replies(g)
    _, r = join(g, 1.0, instance="i1")  # restarted instance: no member id
    assert r is not None and r.error == ErrorCode.none and r.member_id != old
    assert r.generation == 1 and r.leader == old  # the old leader id: it must not compute a new assignment
    assert g.state is State.STABLE and g.store_requested
    _, mine = sync(g, 1.1, r.member_id, 1, instance="i1")
    assert mine is not None and mine.assignment == b"A"
    assert g.heartbeat(1.2, old, "i1", 1) == ErrorCode.fenced_instance_id
    # A static member is not dropped for missing a rebalance; leaving by instance id alone works.
    assert g.leave(2.0, [("", "i1")]) == (ErrorCode.none, [ErrorCode.none])
    assert not g.members and g.state is State.EMPTY


def test_a_group_instance_id_the_group_does_not_know_is_an_unknown_member() -> None:
    """Kafka's validateMember: a request naming a group.instance.id must name one of the group's static members,
    even when its member id is a current (dynamic) member's; a known one naming another member id is fenced."""
    g, (a, _) = stable_group(2)
    generation = g.generation
    assert g.heartbeat(1.0, a, None, generation) == ErrorCode.none
    assert g.heartbeat(1.0, a, "nobody", generation) == ErrorCode.unknown_member_id
    assert g.check_commit(1.0, a, "nobody", generation) == ErrorCode.unknown_member_id
    assert sync(g, 1.0, a, generation, instance="nobody")[1] == SyncResult(ErrorCode.unknown_member_id)
    assert g.leave(1.0, [(a, "nobody")]) == (ErrorCode.none, [ErrorCode.unknown_member_id])
    assert a in g.members and g.state is State.STABLE  # nothing changed
    join(g, 1.0, instance="i1")  # a static member joins (and waits at the barrier)
    static = g.static_members["i1"]
    assert g.heartbeat(1.1, a, "i1", g.generation) == ErrorCode.fenced_instance_id  # i1 is not a's instance
    assert g.static_error("i1", static) == ErrorCode.none and g.static_error(None, "anyone") == ErrorCode.none


def test_batch_leave_reports_each_member() -> None:
    g, (a, b) = stable_group(2)
    error, errors = g.leave(1.0, [(a, None), ("nobody", None), (b, None)])
    assert error == ErrorCode.none and errors == [ErrorCode.none, ErrorCode.unknown_member_id, ErrorCode.none]
    assert g.state is State.EMPTY and g.generation == 3 and g.store_requested


def test_leaving_member_completes_a_waiting_barrier() -> None:
    g, (a, b) = stable_group(2)
    t, _ = join(g, 1.0, a)
    g.leave(1.1, [(b, None)])
    assert replies(g)[t].generation == g.generation


def test_commit_validation() -> None:
    empty = Group("g", GroupSettings(), 0.0)
    assert empty.check_commit(0, "", None, -1) == ErrorCode.none  # standalone commit
    g, (a, _) = stable_group(2)
    assert g.check_commit(1, "", None, -1) == ErrorCode.unknown_member_id
    assert g.check_commit(1, a, None, g.generation) == ErrorCode.none
    assert g.check_commit(1, a, None, g.generation - 1) == ErrorCode.illegal_generation
    join(g, 2, v4=False)  # a new member: PreparingRebalance still accepts commits of the current generation
    assert g.check_commit(2, a, None, g.generation) == ErrorCode.none


def test_initial_rebalance_delay_collects_members() -> None:
    g = Group("g", GroupSettings(initial_rebalance_delay_ms=300), 0.0)
    t1, _ = join(g, 0.0, v4=False)
    t2, _ = join(g, 0.2, v4=False)
    assert not replies(g)
    g.expire(0.3)  # a member came during the delay: wait once more
    assert not replies(g)
    g.expire(0.6)
    answers = replies(g)
    assert set(answers) == {t1, t2} and answers[t1].generation == 1


def test_stored_group_restores_as_stable_with_fresh_sessions() -> None:
    g, ids = stable_group(3)
    value = group_value(g)
    restored = load_group("g", value, GroupSettings(), 100.0)
    assert restored.state is State.STABLE and restored.generation == g.generation
    assert restored.leader == g.leader and list(restored.members) == ids
    assert [m.assignment for m in restored.members.values()] == [b"a0", b"a1", b"a2"]
    assert restored.heartbeat(101, ids[0], None, g.generation) == ErrorCode.none
    assert min(m.heartbeat_deadline for m in restored.members.values()) >= 100 + SESSION / 1000
    g.leave(5.0, [(m, None) for m in ids])
    empty = load_group("g", group_value(g), GroupSettings(), 100.0)
    assert empty.state is State.EMPTY and empty.state_since == 5.0


def test_offset_expiry_follows_kip_211() -> None:
    day = 86_400_000
    entry = OffsetEntry(5, -1, "", commit_ms=0)
    g, _ = stable_group(1)
    offsets = {("t", 0): entry, ("gone", 0): entry}
    # Stable consumer group: only topics it no longer subscribes to expire.
    assert expired_offsets(g, offsets, now_ms=2 * day, retention_ms=day) == [("gone", 0)]
    g.leave(10.0, [(m, None) for m in list(g.members)])  # Empty at t=10 s: retention counts from there
    assert expired_offsets(g, offsets, now_ms=day, retention_ms=day) == []
    assert len(expired_offsets(g, offsets, now_ms=day + 10_000, retention_ms=day)) == 2
    standalone = Group("s", GroupSettings(), 0.0)
    explicit = {("t", 0): OffsetEntry(1, -1, "", commit_ms=0, expire_ms=1000), ("t", 1): entry}
    assert expired_offsets(standalone, explicit, now_ms=1000, retention_ms=day) == [("t", 0)]
