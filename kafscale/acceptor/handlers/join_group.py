"""JoinGroup v0-v7: the rebalance barrier, MEMBER_ID_REQUIRED (v4+), static membership (v5+).

The answer waits until every known member has re-joined or the rebalance timeout has passed (kafscale/groups/state.py);
only the leader's answer lists the members, whose metadata its client-side assignor uses.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed, make, ms, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.groups.state import JoinResult
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 11, 0, 7


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    result = await _join(ctx, req, broker)
    mod = response_module(ctx)
    members = tuple(make(mod.JoinGroupResponseMember, member_id=m, group_instance_id=i, metadata=data)
                    for m, i, data in result.members)
    nullable = ctx.api_version >= 7  # before v7 "no protocol" is an empty string
    return make(mod.JoinGroupResponse, throttle_time=NO_THROTTLE, error_code=result.error,
                generation_id=result.generation,
                protocol_type=result.protocol_type if nullable else result.protocol_type or "",
                protocol_name=result.protocol_name if nullable else result.protocol_name or "",
                leader=result.leader, member_id=result.member_id, members=members)


async def _join(ctx: RequestContext, req: Any, broker: Broker) -> JoinResult:
    if not req.group_id:
        return JoinResult(ErrorCode.invalid_group_id, req.member_id)
    if not allowed(broker, ctx, Operation.READ, ResourceType.GROUP, req.group_id):
        return JoinResult(ErrorCode.group_authorization_failed, req.member_id)
    error, coordinator = await broker.groups.lookup(req.group_id, create=req.member_id == "")
    if error != ErrorCode.none:
        return JoinResult(error, req.member_id)
    if coordinator is None:  # a member id for a group that does not exist
        return JoinResult(ErrorCode.unknown_member_id, req.member_id)
    session = ms(req.session_timeout)
    rebalance = ms(getattr(req, "rebalance_timeout", None), session)  # v0 has none: the session timeout
    return await coordinator.join(
        member_id=req.member_id, instance_id=getattr(req, "group_instance_id", None), client_id=ctx.client_id or "",
        client_host=f"/{ctx.client_host}", session_timeout_ms=session,
        rebalance_timeout_ms=rebalance if rebalance > 0 else session, protocol_type=req.protocol_type,
        protocols=[(p.name, p.metadata) for p in req.protocols], require_known_member_id=ctx.api_version >= 4)
