"""SyncGroup v0-v5: the leader hands in the assignment its client computed; every member receives its own part.

The broker never assigns: members get exactly the bytes the leader sent (range, roundrobin, sticky and
cooperative-sticky are all client-side). v5 checks the protocol type and name against the group's.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.groups.state import SyncResult
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 14, 0, 5


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    result = await _sync(req, broker) if allowed(broker, ctx, Operation.READ, ResourceType.GROUP, req.group_id) \
        else SyncResult(ErrorCode.group_authorization_failed)
    return make(response_module(ctx).SyncGroupResponse, throttle_time=NO_THROTTLE, error_code=result.error,
                protocol_type=result.protocol_type, protocol_name=result.protocol_name,
                assignment=result.assignment)


async def _sync(req: Any, broker: Broker) -> SyncResult:
    if not req.group_id:
        return SyncResult(ErrorCode.invalid_group_id)
    error, coordinator = await broker.groups.lookup(req.group_id)
    if error != ErrorCode.none:
        return SyncResult(error)
    if coordinator is None:
        return SyncResult(ErrorCode.unknown_member_id)
    return await coordinator.sync(
        member_id=req.member_id, instance_id=getattr(req, "group_instance_id", None), generation=req.generation_id,
        protocol_type=getattr(req, "protocol_type", None), protocol_name=getattr(req, "protocol_name", None),
        assignments={a.member_id: a.assignment for a in req.assignments})
