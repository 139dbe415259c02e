"""The group APIs the proxy passes through to the group's upstream coordinator unchanged: JoinGroup, SyncGroup,
Heartbeat, LeaveGroup, DescribeGroups. Assignments are the clients' own business (the leader computes them from
the proxy's metadata, in virtual partitions) and opaque to the coordinator. ListGroups goes to the bootstrap
broker, as clients send it to any broker."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.proxy.state import Call
from kafscale.proxy.upstream import CoordinatorUnknown

VERSIONS = {11: (0, 9), 12: (0, 4), 13: (0, 5), 14: (0, 5), 15: (0, 5), 16: (0, 4)}
LIST_GROUPS = 16
DESCRIBE_GROUPS = 15
_MOVED = (ErrorCode.not_coordinator, ErrorCode.coordinator_not_available)


async def handle(call: Call, request: Any) -> Any:
    if request.__api_key__ == LIST_GROUPS:
        return await call.session.send(request)
    group = request.groups[0] if request.__api_key__ == DESCRIBE_GROUPS else request.group_id
    answer = await to_coordinator(call, group, request)
    return answer


async def to_coordinator(call: Call, group: str, request: Any) -> Any:
    """Send a group request to the group's coordinator; a moved coordinator is forgotten, and the client's
    retry (after its own FindCoordinator, answered by the proxy) finds the new one."""
    try:
        node = await call.session.coordinator(group)
    except CoordinatorUnknown:
        node = None
    answer = await call.session.send(request, node)
    if getattr(answer, "error_code", ErrorCode.none) in _MOVED:
        call.session.forget_coordinator(group)
    return answer
