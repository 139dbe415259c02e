"""DeleteRecords v0-v2: move a partition's log start offset forward (durably); whole segments below it go.

Offset -1 means the high watermark (delete everything), as in Kafka. An offset above the high
watermark is OFFSET_OUT_OF_RANGE; one below the current start changes nothing and reports the start.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.broker.results import DeleteRecordsResult
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 21, 0, 2


async def _denied() -> DeleteRecordsResult:
    return DeleteRecordsResult(int(ErrorCode.topic_authorization_failed))


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    jobs = [(t.name, int(p.partition_index), int(p.offset)) for t in req.topics for p in t.partitions]
    may = {t.name: allowed(broker, ctx, Operation.DELETE, ResourceType.TOPIC, t.name) for t in req.topics}
    answers = iter(await asyncio.gather(*(broker.delete_records(*job) if may[job[0]] else _denied() for job in jobs)))
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            r = next(answers)
            parts.append(make(mod.DeleteRecordsPartitionResult, partition_index=p.partition_index,
                              low_watermark=r.low_watermark, error_code=r.error))
        topics.append(make(mod.DeleteRecordsTopicResult, name=t.name, partitions=tuple(parts)))
    return make(mod.DeleteRecordsResponse, throttle_time=NO_THROTTLE, topics=tuple(topics))
