"""LeaveGroup v0-v5: one member (v0-v2) or a batch (v3+, static members also by group.instance.id alone); v5
members may say why they leave (KIP-800), which only Kafka's log shows, so it is not kept."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 13, 0, 5


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    if ctx.api_version < 3:
        leaving: list[tuple[str, str | None]] = [(req.member_id, None)]
    else:
        leaving = [(m.member_id, m.group_instance_id) for m in req.members]
    if not allowed(broker, ctx, Operation.READ, ResourceType.GROUP, req.group_id):
        error, member_errors = ErrorCode.group_authorization_failed, [ErrorCode.group_authorization_failed]
    else:
        error, member_errors = await _leave(req.group_id, leaving, broker)
    if ctx.api_version < 3:
        # One member: its outcome is the answer (Kafka's LeaveGroupResponse for old versions).
        return make(mod.LeaveGroupResponse, throttle_time=NO_THROTTLE,
                    error_code=error if error != ErrorCode.none else member_errors[0])
    members = tuple(make(mod.MemberResponse, member_id=m, group_instance_id=i, error_code=e)
                    for (m, i), e in zip(leaving, member_errors, strict=False) if error == ErrorCode.none)
    return make(mod.LeaveGroupResponse, throttle_time=NO_THROTTLE, error_code=error, members=members)


async def _leave(group_id: str, leaving: list[tuple[str, str | None]],
                 broker: Broker) -> tuple[ErrorCode, list[ErrorCode]]:
    if not group_id:
        return ErrorCode.invalid_group_id, [ErrorCode.invalid_group_id] * len(leaving)
    error, coordinator = await broker.groups.lookup(group_id)
    if error != ErrorCode.none:
        return error, [error] * len(leaving)
    if coordinator is None:
        return ErrorCode.none, [ErrorCode.unknown_member_id] * len(leaving)
    error, member_errors = await coordinator.leave(leaving)
    return error, member_errors or [error] * len(leaving)
