"""JoinGroup on one group's state machine (kafscale.groups.state): new, pending, current and static members.

Kafka's GroupCoordinator.handleJoinGroup is the reference: a member without an id gets one (and, with KIP-394,
must come back with it); a known group.instance.id replaces its old member, which is fenced; a current member
re-joining with new metadata, or the leader re-joining, starts a rebalance. These are functions over the
group's state: `Group.join` calls `join`, and the rebalance barrier they lead to is in the state machine.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from kafscale.groups.members import JoinResult, Member, State, SyncResult

if TYPE_CHECKING:
    from kafscale.groups.state import Group


def join(group: Group, now: float, *, ticket: int, member_id: str, instance_id: str | None, client_id: str,
         client_host: str, session_timeout_ms: int, rebalance_timeout_ms: int, protocol_type: str,
         protocols: list[tuple[str, bytes]], require_known_member_id: bool) -> JoinResult | None:
    """Kafka's handleJoinGroup: an answer now, or None when the answer comes through `group.replies`."""
    s = group.settings
    if not s.min_session_timeout_ms <= session_timeout_ms <= s.max_session_timeout_ms:
        return JoinResult(ErrorCode.invalid_session_timeout, member_id)
    if group.state is State.DEAD:
        return JoinResult(ErrorCode.coordinator_not_available, member_id)
    if not group.supports(protocol_type, {n for n, _ in protocols}):
        return JoinResult(ErrorCode.inconsistent_group_protocol, member_id)
    spec = dict(instance_id=instance_id, client_id=client_id, client_host=client_host,
                session_timeout_ms=session_timeout_ms, rebalance_timeout_ms=rebalance_timeout_ms,
                protocol_type=protocol_type, protocols=protocols)
    if member_id == "":
        if s.max_size and len(group.members) + len(group.pending_members) >= s.max_size:
            return JoinResult(ErrorCode.group_max_size_reached, member_id)
        new_id = f"{instance_id or client_id}-{uuid.uuid4()}"
        if instance_id is not None:
            result = _static_join(group, now, ticket, new_id, spec)
        elif require_known_member_id:
            # KIP-394: the id is only remembered; the member counts once it joins again with it.
            group.pending_members[new_id] = now + session_timeout_ms / 1000
            return JoinResult(ErrorCode.member_id_required, new_id)
        else:
            _add_member(group, now, ticket, new_id, spec)
            result = None
    elif member_id in group.pending_members:
        del group.pending_members[member_id]
        _add_member(group, now, ticket, member_id, spec)
        result = None
    else:
        result = _current_member_join(group, now, ticket, member_id, spec)
    if group.state is State.PREPARING:
        group._try_complete_join(now)
    return result


def _current_member_join(group: Group, now: float, ticket: int, member_id: str,
                         spec: dict[str, Any]) -> JoinResult | None:
    instance_id = spec["instance_id"]
    if (static := group.static_error(instance_id, member_id)) != ErrorCode.none:
        return JoinResult(static, member_id)
    if member_id not in group.members:
        return JoinResult(ErrorCode.unknown_member_id, member_id)
    member = group.members[member_id]
    same = member.protocols == spec["protocols"]
    if group.state is State.PREPARING:
        _update_member(group, now, member, ticket, spec)
        return None
    if group.state is State.COMPLETING and same:
        # It lost the answer of this generation's JoinGroup: give it again.
        return group._join_result(member_id)
    if group.state is State.STABLE and same and member_id != group.leader:
        return group._join_result(member_id)
    if group.state in (State.COMPLETING, State.STABLE):
        # Changed metadata, or the leader re-joining (it does so to rebalance on topic changes).
        _update_member(group, now, member, ticket, spec)
        group._prepare_rebalance(now, f"{'leader' if member_id == group.leader else 'member'} {member_id} "
                                f"re-joined{'' if same else ' with new metadata'}")
        return None
    return JoinResult(ErrorCode.unknown_member_id, member_id)


def _static_join(group: Group, now: float, ticket: int, new_id: str, spec: dict[str, Any]) -> JoinResult | None:
    """A known group.instance.id joining without a member id replaces the old member (which is fenced)
    and, in a Stable group whose protocol would not change, gets the current assignment without a rebalance."""
    instance_id = spec["instance_id"]
    old_id = group.static_members.get(instance_id)
    if old_id is None or old_id not in group.members:
        _add_member(group, now, ticket, new_id, spec)
        return None
    old_leader = group.leader
    member = group.members.pop(old_id)
    group._reply_join(member, JoinResult(ErrorCode.fenced_instance_id, old_id))
    group._reply_sync(member, SyncResult(ErrorCode.fenced_instance_id))
    member.member_id = new_id
    group.members[new_id] = member
    group.static_members[instance_id] = new_id
    if group.leader == old_id:
        group.leader = new_id
    if old_id in group.pending_sync:
        group.pending_sync.discard(old_id)
        group.pending_sync.add(new_id)
    member.heartbeat_deadline = now + member.session_timeout_ms / 1000
    if group.state is State.STABLE:
        previous = member.protocols
        member.protocols = spec["protocols"]
        if group.select_protocol() == group.protocol_name:
            member.session_timeout_ms = spec["session_timeout_ms"]
            member.rebalance_timeout_ms = spec["rebalance_timeout_ms"]
            group.store_requested = True
            # The old leader id is returned so that a replaced leader does not compute an assignment a
            # Stable group would never hand out.
            return JoinResult(ErrorCode.none, new_id, group.generation, group.protocol_type, group.protocol_name,
                              old_leader or "")
        member.protocols = previous
    _update_member(group, now, member, ticket, spec)
    if group.state is not State.PREPARING:
        group._prepare_rebalance(now, f"static member {instance_id} re-joined")
    return None


def _add_member(group: Group, now: float, ticket: int, member_id: str, spec: dict[str, Any]) -> None:
    member = Member(member_id=member_id, is_new=True, join_ticket=ticket, **spec)
    if group.state is State.PREPARING and group.generation == 0:
        group.new_member_added = True
    if not group.members:
        group.protocol_type = member.protocol_type
    group.members[member_id] = member
    if member.instance_id is not None:
        group.static_members[member.instance_id] = member_id
    if group.leader is None:
        group.leader = member_id
    member.heartbeat_deadline = now + group.settings.new_member_join_timeout_ms / 1000
    if group.state in (State.EMPTY, State.STABLE, State.COMPLETING):
        group._prepare_rebalance(now, f"member {member_id} joined")


def _update_member(group: Group, now: float, member: Member, ticket: int, spec: dict[str, Any]) -> None:
    member.protocols = spec["protocols"]
    member.session_timeout_ms = spec["session_timeout_ms"]
    member.rebalance_timeout_ms = spec["rebalance_timeout_ms"]
    if member.join_ticket is not None and member.join_ticket != ticket:
        # A second JoinGroup while the first still waits: the client gave up on the first.
        group._reply_join(member, JoinResult(ErrorCode.rebalance_in_progress, member.member_id))
    member.join_ticket = ticket
