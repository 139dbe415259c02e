"""The group APIs the proxy passes through to the group's upstream coordinator unchanged: JoinGroup, SyncGroup,
Heartbeat, LeaveGroup. Assignments are the clients' own business (the leader computes them from the proxy's
metadata, in virtual partitions) and opaque to the coordinator. DescribeGroups is split by coordinator and the
answers joined; ListGroups asks every upstream broker, as the proxy is the only broker its clients see."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.protocol.codec import replace
from kafscale.proxy.state import Call
from kafscale.proxy.upstream import CoordinatorUnknown

VERSIONS = {11: (0, 9), 12: (0, 4), 13: (0, 5), 14: (0, 5), 15: (0, 5), 16: (0, 4)}
LIST_GROUPS = 16
DESCRIBE_GROUPS = 15
_MOVED = (ErrorCode.not_coordinator, ErrorCode.coordinator_not_available)
log = logging.getLogger(__name__)


async def handle(call: Call, request: Any) -> Any:
    if request.__api_key__ == LIST_GROUPS:
        return await _list(call, request)
    if request.__api_key__ == DESCRIBE_GROUPS:
        return await _describe(call, request)
    return await to_coordinator(call, request.group_id, request)


async def coordinator_of(call: Call, group: str) -> int | None:
    """The group's upstream coordinator; None (the bootstrap broker, which answers NOT_COORDINATOR if it is not
    the one) when the upstream cannot say now."""
    try:
        return await call.session.coordinator(group)
    except CoordinatorUnknown:
        return None


async def to_coordinator(call: Call, group: str, request: Any) -> Any:
    """Send a group request to the group's coordinator; a moved coordinator is forgotten, and the client's
    retry (after its own FindCoordinator, answered by the proxy) finds the new one."""
    answer = await call.session.send(request, await coordinator_of(call, group))
    if _moved(answer):
        call.session.forget_coordinator(group)
    return answer


def _moved(answer: Any) -> bool:
    """Whether the answer says the coordinator is elsewhere: at its top, or for any partition (OffsetCommit)."""
    if getattr(answer, "error_code", ErrorCode.none) in _MOVED:
        return True
    return any(p.error_code in _MOVED for t in getattr(answer, "topics", None) or ()
               for p in getattr(t, "partitions", ()))


async def _describe(call: Call, request: Any) -> Any:
    if not request.groups:
        return await call.session.send(request)
    by_node: dict[int | None, list[str]] = defaultdict(list)
    for group in request.groups:
        by_node[await coordinator_of(call, group)].append(group)
    answers = await asyncio.gather(*(call.session.send(replace(request, groups=tuple(groups)), node)
                                     for node, groups in by_node.items()))
    described = {}
    for answer in answers:
        for group in answer.groups:
            described[group.group_id] = group
            if group.error_code in _MOVED:
                call.session.forget_coordinator(group.group_id)
    return replace(answers[0], groups=tuple(described[g] for g in request.groups if g in described))


async def _list(call: Call, request: Any) -> Any:
    nodes: list[int | None] = list(call.proxy.cluster.brokers) or [None]
    replies = await asyncio.gather(*(call.session.send(request, node) for node in nodes), return_exceptions=True)
    answers = [r for r in replies if not isinstance(r, BaseException)]
    if not answers:  # nobody answered: as if the upstream could not be reached
        raise next(r for r in replies if isinstance(r, BaseException))
    if len(answers) < len(replies):
        log.warning("ListGroups: %d of %d upstream brokers did not answer; the list is partial",
                    len(replies) - len(answers), len(replies))
    groups = {g.group_id: g for answer in answers for g in answer.groups}
    error = next((a.error_code for a in answers if a.error_code != ErrorCode.none), ErrorCode.none)
    return replace(answers[0], error_code=error, groups=tuple(groups.values()))
