"""OffsetDelete v0: removes committed offsets of an Empty group, or of topics an active group does not consume."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 47, 0, 0


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    error, errors = await _delete(req, broker, ctx)
    if error != ErrorCode.none:
        return make(mod.OffsetDeleteResponse, error_code=error, throttle_time=NO_THROTTLE, topics=())
    topics = tuple(
        make(mod.OffsetDeleteResponseTopic, name=t.name, partitions=tuple(
            make(mod.OffsetDeleteResponsePartition, partition_index=p.partition_index,
                 error_code=errors[(t.name, p.partition_index)]) for p in t.partitions))
        for t in req.topics)
    return make(mod.OffsetDeleteResponse, error_code=error, throttle_time=NO_THROTTLE, topics=topics)


async def _delete(req: Any, broker: Broker, ctx: RequestContext) -> tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]:
    if not allowed(broker, ctx, Operation.DELETE, ResourceType.GROUP, req.group_id):
        return ErrorCode.group_authorization_failed, {}
    error, coordinator = await broker.groups.lookup(req.group_id)
    if error != ErrorCode.none:
        return error, {}
    if coordinator is None:
        return ErrorCode.group_id_not_found, {}
    errors: dict[tuple[str, int], ErrorCode] = {}
    known = []
    for t in req.topics:
        info = await broker.topics.get(t.name)
        readable = allowed(broker, ctx, Operation.READ, ResourceType.TOPIC, t.name)
        for p in t.partitions:
            if not readable:
                errors[(t.name, p.partition_index)] = ErrorCode.topic_authorization_failed
            elif info is None or not 0 <= p.partition_index < info.partitions:
                errors[(t.name, p.partition_index)] = ErrorCode.unknown_topic_or_partition
            else:
                known.append((t.name, p.partition_index))
    error, deleted = await coordinator.delete_offsets(known)
    return error, {**errors, **deleted}
