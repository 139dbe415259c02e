"""DescribeGroups v0-v5: state, protocol, and members with client id, host, metadata and assignment.
A consumer-protocol group (KIP-848) is not a classic group: like Kafka 4.4, these versions report it Dead
(ConsumerGroupDescribe describes it).

As in Kafka 4, a member's metadata is shown only while the group is Stable, its current assignment in every state,
and a group that does not exist is reported as Dead without an error.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import (
    NO_THROTTLE,
    OPERATIONS_NOT_REQUESTED,
    allowed,
    authorized_operations,
    make,
    response_module,
)
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.groups.consumer.group import ConsumerGroup
from kafscale.groups.state import State
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 15, 0, 5
NOT_REQUESTED = OPERATIONS_NOT_REQUESTED


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    wanted = bool(getattr(req, "include_authorized_operations", False))
    groups = []
    for group_id in req.groups:
        fields: dict[str, Any] = {"group_state": "", "protocol_type": "", "protocol_data": "", "members": ()}
        if not allowed(broker, ctx, Operation.DESCRIBE, ResourceType.GROUP, group_id):
            groups.append(make(mod.DescribedGroup, error_code=ErrorCode.group_authorization_failed,
                               group_id=group_id, authorized_operations=NOT_REQUESTED, **fields))
            continue
        error, coordinator = await broker.groups.lookup(group_id)
        if error == ErrorCode.none:
            fields["group_state"] = State.DEAD.value
        if coordinator is not None and not isinstance(coordinator.group, ConsumerGroup):
            g = coordinator.group
            stable = g.state is State.STABLE
            fields = {
                "group_state": g.state.value, "protocol_type": g.protocol_type or "",
                "protocol_data": (g.protocol_name or "") if stable else "",
                "members": tuple(make(
                    mod.DescribedGroupMember, member_id=m.member_id, group_instance_id=m.instance_id,
                    client_id=m.client_id, client_host=m.client_host,
                    member_metadata=m.metadata(g.protocol_name) if stable else b"",
                    member_assignment=m.assignment) for m in g.members.values()),
            }
        groups.append(make(mod.DescribedGroup, error_code=error, group_id=group_id,
                           authorized_operations=authorized_operations(broker, ctx, ResourceType.GROUP, group_id)
                           if wanted else NOT_REQUESTED,
                           **fields))
    return make(mod.DescribeGroupsResponse, throttle_time=NO_THROTTLE, groups=tuple(groups))

