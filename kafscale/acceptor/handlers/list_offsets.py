"""ListOffsets v1-v8: earliest (-2), latest (-1), max timestamp (-3), or by timestamp."""

from __future__ import annotations

import asyncio
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.broker.results import OffsetResult
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 2, 1, 8


async def _denied() -> OffsetResult:
    return OffsetResult(int(ErrorCode.topic_authorization_failed))


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    jobs = [(t.name, int(p.partition_index), int(p.timestamp)) for t in req.topics for p in t.partitions]
    may = {t.name: allowed(broker, ctx, Operation.DESCRIBE, ResourceType.TOPIC, t.name) for t in req.topics}
    results = iter(await asyncio.gather(*(broker.list_offset(t, p, ts) if may[t] else _denied()
                                          for t, p, ts in jobs)))
    mod = response_module(ctx)
    topics = []
    for t in req.topics:
        partitions = []
        for p in t.partitions:
            r = next(results)
            partitions.append(make(
                mod.ListOffsetsPartitionResponse,
                partition_index=p.partition_index,
                error_code=ErrorCode(r.error),
                timestamp=r.timestamp,
                offset=r.offset,
                leader_epoch=-1,
            ))
        topics.append(make(mod.ListOffsetsTopicResponse, name=t.name, partitions=tuple(partitions)))
    return make(mod.ListOffsetsResponse, throttle_time=NO_THROTTLE, topics=tuple(topics))
