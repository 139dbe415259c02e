"""Heartbeat v0-v4: keeps a member's session alive; REBALANCE_IN_PROGRESS tells it to re-join."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from kafscale.server.handlers.common import NO_THROTTLE, make, response_module
from kafscale.server.router import RequestContext, Router

if TYPE_CHECKING:
    from kafscale.broker.shard import ShardCore

API_KEY, MIN_VERSION, MAX_VERSION = 12, 0, 4


def register(router: Router, shard: ShardCore) -> None:
    async def handle(ctx: RequestContext, req: Any) -> Any:
        return make(response_module(ctx).HeartbeatResponse, throttle_time=NO_THROTTLE,
                    error_code=await _heartbeat(req, shard))

    router.register(API_KEY, MIN_VERSION, MAX_VERSION, handle)


async def _heartbeat(req: Any, shard: ShardCore) -> ErrorCode:
    if not req.group_id:
        return ErrorCode.invalid_group_id
    error, coordinator = await shard.groups.lookup(req.group_id)
    if error != ErrorCode.none:
        return error
    if coordinator is None:
        return ErrorCode.unknown_member_id
    return await coordinator.heartbeat(req.member_id, getattr(req, "group_instance_id", None), req.generation_id)
