"""A consumer group as the metadata store keeps it (groups/{g}): what a coordinator writes after a membership
change or a stored assignment, and what a coordinator taking the group over reads back."""

from __future__ import annotations

from typing import Any

from kafscale.cluster import keys
from kafscale.groups.members import GroupSettings, Member, State
from kafscale.groups.state import Group


def group_value(group: Group, assignment: dict[str, bytes] | None = None) -> dict[str, Any]:
    return {
        "generation": group.generation, "protocol_type": group.protocol_type, "protocol": group.protocol_name,
        "leader": group.leader, "state_ms": int(group.state_since * 1000),
        "members": [{
            "id": m.member_id, "instance": m.instance_id, "client": m.client_id, "host": m.client_host,
            "session_ms": m.session_timeout_ms, "rebalance_ms": m.rebalance_timeout_ms,
            "protocols": [[n, d] for n, d in m.protocols],
            "assignment": m.assignment if assignment is None else assignment.get(m.member_id, b""),
        } for m in group.members.values()],
    }


def group_records(group: Group, assignment: dict[str, bytes] | None = None) -> dict[str, Any]:
    """Every record of the group, by key: a classic group is one record."""
    return {keys.group(group.group_id): group_value(group, assignment)}


def load_group(group_id: str, value: dict[str, Any], settings: GroupSettings, now: float) -> Group:
    """A coordinator taking the group over: Stable with the stored members (their sessions restart), or Empty."""
    group = Group(group_id, settings, now)
    group.generation = int(value["generation"])
    group.protocol_type = value.get("protocol_type")
    group.protocol_name = value.get("protocol")
    group.leader = value.get("leader")
    for v in value.get("members", []):
        m = Member(member_id=v["id"], instance_id=v["instance"], client_id=v["client"], client_host=v["host"],
                   session_timeout_ms=int(v["session_ms"]), rebalance_timeout_ms=int(v["rebalance_ms"]),
                   protocol_type=group.protocol_type or "", protocols=[(n, bytes(d)) for n, d in v["protocols"]],
                   assignment=bytes(v["assignment"]))
        m.heartbeat_deadline = now + m.session_timeout_ms / 1000
        group.members[m.member_id] = m
        if m.instance_id is not None:
            group.static_members[m.instance_id] = m.member_id
    if group.members and group.protocol_name is not None:
        group.state = State.STABLE
    else:
        group.members.clear()
        group.static_members.clear()
        group.leader = None
        group.state_since = int(value.get("state_ms", now * 1000)) / 1000
    return group
