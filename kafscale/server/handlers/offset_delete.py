"""OffsetDelete v0: removes committed offsets of an Empty group, or of topics an active group does not consume."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from kafscale.server.handlers.common import NO_THROTTLE, make, response_module
from kafscale.server.router import RequestContext, Router

if TYPE_CHECKING:
    from kafscale.broker.shard import ShardCore

API_KEY, MIN_VERSION, MAX_VERSION = 47, 0, 0


def register(router: Router, shard: ShardCore) -> None:
    async def handle(ctx: RequestContext, req: Any) -> Any:
        mod = response_module(ctx)
        error, errors = await _delete(req, shard)
        if error != ErrorCode.none:
            return make(mod.OffsetDeleteResponse, error_code=error, throttle_time=NO_THROTTLE, topics=())
        topics = tuple(
            make(mod.OffsetDeleteResponseTopic, name=t.name, partitions=tuple(
                make(mod.OffsetDeleteResponsePartition, partition_index=p.partition_index,
                     error_code=errors[(t.name, p.partition_index)]) for p in t.partitions))
            for t in req.topics)
        return make(mod.OffsetDeleteResponse, error_code=error, throttle_time=NO_THROTTLE, topics=topics)

    router.register(API_KEY, MIN_VERSION, MAX_VERSION, handle)


async def _delete(req: Any, shard: ShardCore) -> tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]:
    error, coordinator = await shard.groups.lookup(req.group_id)
    if error != ErrorCode.none:
        return error, {}
    if coordinator is None:
        return ErrorCode.group_id_not_found, {}
    errors: dict[tuple[str, int], ErrorCode] = {}
    known = []
    for t in req.topics:
        info = await shard.topics.get(t.name)
        for p in t.partitions:
            if info is None or not 0 <= p.partition_index < info.partitions:
                errors[(t.name, p.partition_index)] = ErrorCode.unknown_topic_or_partition
            else:
                known.append((t.name, p.partition_index))
    error, deleted = await coordinator.delete_offsets(known)
    return error, {**errors, **deleted}
