"""DeleteRecords v0-v2: move a partition's log start offset forward (durably); whole segments below it go.

Offset -1 means the high watermark (delete everything), as in Kafka. An offset above the high
watermark is OFFSET_OUT_OF_RANGE; one below the current start changes nothing and reports the start.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kafscale.broker.interface import Broker
from kafscale.server.handlers.common import NO_THROTTLE, make, response_module
from kafscale.server.router import RequestContext

API_KEY, MIN_VERSION, MAX_VERSION = 21, 0, 2


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    jobs = [(t.name, int(p.partition_index), int(p.offset)) for t in req.topics for p in t.partitions]
    answers = iter(await asyncio.gather(*(broker.delete_records(*job) for job in jobs)))
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            r = next(answers)
            parts.append(make(mod.DeleteRecordsPartitionResult, partition_index=p.partition_index,
                              low_watermark=r.low_watermark, error_code=r.error))
        topics.append(make(mod.DeleteRecordsTopicResult, name=t.name, partitions=tuple(parts)))
    return make(mod.DeleteRecordsResponse, throttle_time=NO_THROTTLE, topics=tuple(topics))
