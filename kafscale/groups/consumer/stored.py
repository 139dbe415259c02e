"""A consumer-protocol group as the metadata store keeps it: a header (groups/{g}, with "type": "consumer": the
epochs, the assignor, the subscribed topics) and one record per member (group_members/{g}/{member}: its epochs,
subscription, assignment and target). A heartbeat that changed the group writes the records it changed
(stored_records.py); the coordinator that takes the group over reads them back (members' sessions and revocation
deadlines restart there).

Groups stored before members had records of their own keep them in the header ("members", with "target"): they
load as they are and are written in the new layout with their next change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kafscale.cluster import keys
from kafscale.groups.consumer.assignors import Assignment
from kafscale.groups.consumer.group import ConsumerGroup, ConsumerSettings
from kafscale.groups.consumer.member import NEVER, ConsumerMember, MemberState

CONSUMER_TYPE = "consumer"


def is_consumer_group(value: dict[str, Any]) -> bool:
    return value.get("type") == CONSUMER_TYPE


def consumer_group_records(group: ConsumerGroup) -> dict[str, Any]:
    """Every record of the group, by key."""
    records: dict[str, Any] = {keys.group(group.group_id): {
        "type": CONSUMER_TYPE, "epoch": group.epoch, "assignment_epoch": group.assignment_epoch,
        "assignor": group.assignor, "subscribed": group.subscribed, "state_ms": int(group.state_since * 1000)}}
    for m in group.members.values():
        records[keys.group_member(group.group_id, m.member_id)] = {
            "id": m.member_id, "client": m.client_id, "host": m.client_host, "instance": m.instance_id,
            "rack": m.rack_id, "rebalance_ms": m.rebalance_timeout_ms, "names": list(m.subscribed_names),
            "regex": m.subscribed_regex, "assignor": m.server_assignor, "epoch": m.epoch,
            "previous_epoch": m.previous_epoch, "state": m.state.value, "assigned": _assignment_value(m.assigned),
            "revoking": _assignment_value(m.revoking),
            "assigned_at": [[t, p, e] for (t, p), e in sorted(m.assigned_at.items())],
            "target": _assignment_value(group.target.get(m.member_id, {}))}
    return records


def load_consumer_group(group_id: str, value: dict[str, Any], members: Sequence[dict[str, Any]],
                        settings: ConsumerSettings, now: float) -> ConsumerGroup:
    """The group from its header `value` and its member records (an old record's members are in the header)."""
    group = ConsumerGroup(group_id, settings, now)
    group.epoch = int(value["epoch"])
    group.assignment_epoch = int(value["assignment_epoch"])
    group.assignor = value.get("assignor") or settings.assignors[0]
    group.subscribed = {t: int(n) for t, n in value.get("subscribed", {}).items()}
    group.state_since = int(value.get("state_ms", now * 1000)) / 1000
    if "members" in value:
        members = value["members"]
        group.target = {m: _assignment(a) for m, a in value.get("target", {}).items()}
    for v in members:
        if "target" in v:
            group.target[v["id"]] = _assignment(v["target"])
        member = ConsumerMember(
            member_id=v["id"], client_id=v.get("client", ""), client_host=v.get("host", ""),
            instance_id=v.get("instance"), rack_id=v.get("rack"), rebalance_timeout_ms=int(v["rebalance_ms"]),
            subscribed_names=tuple(v.get("names", ())), subscribed_regex=v.get("regex"),
            server_assignor=v.get("assignor"), epoch=int(v["epoch"]), previous_epoch=int(v["previous_epoch"]),
            state=MemberState(v["state"]), assigned=_assignment(v["assigned"]), revoking=_assignment(v["revoking"]),
            session_deadline=now + settings.session_timeout_ms / 1000)
        # A record written before assignment epochs were kept: as if assigned at the member's epoch (commits at
        # older epochs are refused, as they were then).
        member.assigned_at = {(t, int(p)): int(e) for t, p, e in v["assigned_at"]} if "assigned_at" in v \
            else dict.fromkeys(member.owned(), member.epoch)
        if member.state is MemberState.UNREVOKED_PARTITIONS:
            member.revoke_deadline = now + member.rebalance_timeout_ms / 1000
        else:
            member.revoke_deadline = NEVER
        group.members[member.member_id] = member
        if member.instance_id is not None:
            group.static_members[member.instance_id] = member.member_id
    return group


def _assignment_value(assignment: Assignment) -> dict[str, list[int]]:
    return {t: sorted(ps) for t, ps in sorted(assignment.items()) if ps}


def _assignment(value: dict[str, list[int]]) -> Assignment:
    return {t: frozenset(int(p) for p in ps) for t, ps in value.items()}
