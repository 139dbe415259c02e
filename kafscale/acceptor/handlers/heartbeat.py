"""Heartbeat v0-v4: keeps a member's session alive; REBALANCE_IN_PROGRESS tells it to re-join."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 12, 0, 4


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    if not allowed(broker, ctx, Operation.READ, ResourceType.GROUP, req.group_id):
        error = ErrorCode.group_authorization_failed
    else:
        error = await _heartbeat(req, broker)
    return make(response_module(ctx).HeartbeatResponse, throttle_time=NO_THROTTLE, error_code=error)


async def _heartbeat(req: Any, broker: Broker) -> ErrorCode:
    if not req.group_id:
        return ErrorCode.invalid_group_id
    error, coordinator = await broker.groups.lookup(req.group_id)
    if error != ErrorCode.none:
        return error
    if coordinator is None:
        return ErrorCode.unknown_member_id
    return await coordinator.heartbeat(req.member_id, getattr(req, "group_instance_id", None), req.generation_id)
