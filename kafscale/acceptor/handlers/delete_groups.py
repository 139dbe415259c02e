"""DeleteGroups v0-v2: an Empty group is removed with its committed offsets; one with members gets NON_EMPTY_GROUP."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 42, 0, 2


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    results = []
    for group_id in req.groups_names:
        if not allowed(broker, ctx, Operation.DELETE, ResourceType.GROUP, group_id):
            results.append(make(mod.DeletableGroupResult, group_id=group_id,
                                error_code=ErrorCode.group_authorization_failed))
            continue
        error, coordinator = await broker.groups.lookup(group_id)
        if error == ErrorCode.none:
            error = ErrorCode.group_id_not_found if coordinator is None else await coordinator.delete_group()
        results.append(make(mod.DeletableGroupResult, group_id=group_id, error_code=error))
    return make(mod.DeleteGroupsResponse, throttle_time=NO_THROTTLE, results=tuple(results))
