"""OffsetForLeaderEpoch v0-v4: the end offset of a leader epoch, which consumers use to detect truncation.

A partition here never loses committed data (the object store is the only copy, and an offset is never
reused), so no epoch ever ends before the high watermark: the answer for any known epoch is the high
watermark, which tells a consumer its position is valid. Clients ask after a leader change (Metadata
reports each partition's leader epoch, which every move bumps); an undefined epoch (-1) gets Kafka's
undefined answer (epoch -1, offset -1).
"""

from __future__ import annotations

import asyncio
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 23, 0, 4
UNDEFINED = -1


async def end_of(broker: Broker, topic: str, partition: int, epoch: int) -> tuple[ErrorCode, int, int]:
    latest = await broker.list_offset(topic, partition, -1)
    if latest.error:
        return ErrorCode(latest.error), UNDEFINED, UNDEFINED
    if epoch < 0:
        return ErrorCode.none, UNDEFINED, UNDEFINED
    return ErrorCode.none, epoch, latest.offset


async def _denied() -> tuple[ErrorCode, int, int]:
    return ErrorCode.topic_authorization_failed, UNDEFINED, UNDEFINED


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    jobs = [(t.topic, int(p.partition), int(p.leader_epoch)) for t in req.topics for p in t.partitions]
    may = {t.topic: allowed(broker, ctx, Operation.DESCRIBE, ResourceType.TOPIC, t.topic) for t in req.topics}
    answers = iter(await asyncio.gather(*(end_of(broker, *job) if may[job[0]] else _denied() for job in jobs)))
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            code, epoch, offset = next(answers)
            parts.append(make(mod.EpochEndOffset, error_code=code, partition=p.partition, leader_epoch=epoch,
                              end_offset=offset))
        topics.append(make(mod.OffsetForLeaderTopicResult, topic=t.topic, partitions=tuple(parts)))
    return make(mod.OffsetForLeaderEpochResponse, throttle_time=NO_THROTTLE, topics=tuple(topics))
