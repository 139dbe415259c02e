"""ListGroups v0-v5: the groups this shard coordinates (admin clients ask every broker), v4 filters by state, v5
by type (KIP-848): "classic" or "consumer"."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed, allowed_on_cluster, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 16, 0, 5


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    if broker.groups.closed:
        return make(mod.ListGroupsResponse, throttle_time=NO_THROTTLE,
                    error_code=ErrorCode.coordinator_not_available, groups=())
    states = {s.lower() for s in getattr(req, "states_filter", ())}
    types = {t.lower() for t in getattr(req, "types_filter", ())}
    # DESCRIBE on the cluster lists every group; else only those the principal may describe (as Kafka does).
    everything = allowed_on_cluster(broker, ctx, Operation.DESCRIBE)
    groups = tuple(
        make(mod.ListedGroup, group_id=c.group_id, protocol_type=c.group.protocol_type or "",
             group_state=c.group.state_name, group_type=c.group.group_type)
        for c in sorted(await broker.groups.all_groups(), key=lambda c: c.group_id)
        if (not states or c.group.state_name.lower() in states) and (not types or c.group.group_type in types) and (
            everything or allowed(broker, ctx, Operation.DESCRIBE, ResourceType.GROUP, c.group_id)))
    return make(mod.ListGroupsResponse, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, groups=groups)
