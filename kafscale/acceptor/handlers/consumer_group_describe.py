"""ConsumerGroupDescribe v0 (KIP-848): a consumer-protocol group's epochs, assignor, and each member's epoch,
subscription, current assignment and target assignment.

As in Kafka, a group that does not exist, or is a classic group, gets GROUP_ID_NOT_FOUND (admin clients then
describe it with DescribeGroups).
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
from kafscale.groups.consumer.assignors import Assignment
from kafscale.groups.consumer.group import ConsumerGroup
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 69, 0, 0


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    groups = [await _describe(broker, ctx, mod, group_id, req.include_authorized_operations)
              for group_id in req.group_ids]
    return make(mod.ConsumerGroupDescribeResponse, throttle_time=NO_THROTTLE, groups=tuple(groups))


async def _describe(broker: Broker, ctx: RequestContext, mod: Any, group_id: str, operations: bool) -> Any:
    def failed(error: ErrorCode, message: str | None = None) -> Any:
        return make(mod.DescribedGroup, error_code=error, error_message=message, group_id=group_id, group_state="",
                    group_epoch=-1, assignment_epoch=-1, assignor_name="", members=(),
                    authorized_operations=OPERATIONS_NOT_REQUESTED)

    if not allowed(broker, ctx, Operation.DESCRIBE, ResourceType.GROUP, group_id):
        return failed(ErrorCode.group_authorization_failed)
    error, coordinator = await broker.groups.lookup(group_id)
    if error != ErrorCode.none:
        return failed(error)
    group = coordinator.group if coordinator is not None else None
    if not isinstance(group, ConsumerGroup) or group.dead:
        what = "not found" if group is None or group.state_name == "Dead" else "is not a consumer group"
        return failed(ErrorCode.group_id_not_found, f"Group {group_id} {what}.")
    known = broker.topics.topics

    def assignment(a: Assignment) -> Any:
        return make(mod.Assignment, topic_partitions=tuple(
            make(mod.TopicPartitions, topic_id=known[t].id, topic_name=t, partitions=tuple(sorted(ps)))
            for t, ps in sorted(a.items()) if t in known and ps))

    members = tuple(make(
        mod.Member, member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id, member_epoch=m.epoch,
        client_id=m.client_id, client_host=m.client_host, subscribed_topic_names=m.subscribed_names,
        subscribed_topic_regex=m.subscribed_regex, assignment=assignment(m.assigned),
        target_assignment=assignment(group.target.get(m.member_id, {}))) for m in group.members.values())
    return make(mod.DescribedGroup, error_code=ErrorCode.none, group_id=group_id, group_state=group.state_name,
                group_epoch=group.epoch, assignment_epoch=group.assignment_epoch, assignor_name=group.assignor,
                members=members,
                authorized_operations=authorized_operations(broker, ctx, ResourceType.GROUP, group_id)
                if operations else OPERATIONS_NOT_REQUESTED)
