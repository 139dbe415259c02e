"""ListOffsets v0-v8: earliest (-2), latest (-1), max timestamp (-3), or by timestamp.

v0 answers a list of offsets per partition (max_num_offsets of them, Kafka's "offsets before" of the old
consumers) instead of one offset and its timestamp: kafscale/acceptor/legacy.py."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor import legacy
from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.broker.results import OffsetResult
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 2, 0, 8

# The special timestamps of v1+ and the first version that knows each: latest, earliest, max timestamp (KIP-734),
# earliest local (KIP-405: with no local tier, the log start, which is what Kafka without tiered storage answers).
# Any other negative timestamp, or one older than its version, is UNSUPPORTED_VERSION, checked before the partition.
LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL = -1, -2, -3, -4
_SPECIAL_SINCE = {LATEST: 0, EARLIEST: 0, MAX_TIMESTAMP: 7, EARLIEST_LOCAL: 8}


async def _refused(error: ErrorCode) -> OffsetResult:
    return OffsetResult(int(error))


def _lookup(broker: Broker, version: int, topic: str, partition: int, timestamp: int,
            isolation: int) -> Awaitable[OffsetResult]:
    if timestamp < 0 and _SPECIAL_SINCE.get(timestamp, MAX_VERSION + 1) > version:
        return _refused(ErrorCode.unsupported_version)
    return broker.list_offset(topic, partition, EARLIEST if timestamp == EARLIEST_LOCAL else timestamp, isolation)


def _leader_epoch(broker: Broker, topic: str, partition: int, found: OffsetResult) -> int:
    """Kafka names the leader epoch of an offset it found (-1 with none): here the partition's, from placement."""
    info = broker.topics.topics.get(topic)
    if found.error != ErrorCode.none or found.offset < 0 or info is None:
        return -1
    return broker.placement.leader_epoch(info, partition)


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    if ctx.api_version == 0:
        return await _handle_v0(broker, ctx, req)
    jobs = [(t.name, int(p.partition_index), int(p.timestamp)) for t in req.topics for p in t.partitions]
    # A partition named twice is answered once, INVALID_REQUEST, as Kafka does.
    twice = {tp for tp, n in Counter((t, p) for t, p, _ in jobs).items() if n > 1}
    may = {t.name: allowed(broker, ctx, Operation.DESCRIBE, ResourceType.TOPIC, t.name) for t in req.topics}
    isolation = int(getattr(req, "isolation_level", 0))  # v2+; 1: read_committed reads "latest" as the LSO
    results = iter(await asyncio.gather(*(
        _refused(ErrorCode.invalid_request) if (t, p) in twice
        else _lookup(broker, ctx.api_version, t, p, ts, isolation) if may[t]
        else _refused(ErrorCode.topic_authorization_failed)
        for t, p, ts in jobs)))
    mod = response_module(ctx)
    topics, answered = [], set()
    for t in req.topics:
        partitions = []
        for p in t.partitions:
            r = next(results)
            if (t.name, p.partition_index) in answered:
                continue
            answered.add((t.name, p.partition_index))
            partitions.append(make(
                mod.ListOffsetsPartitionResponse,
                partition_index=p.partition_index,
                error_code=ErrorCode(r.error),
                timestamp=r.timestamp,
                offset=r.offset,
                leader_epoch=_leader_epoch(broker, t.name, int(p.partition_index), r),
            ))
        topics.append(make(mod.ListOffsetsTopicResponse, name=t.name, partitions=tuple(partitions)))
    return make(mod.ListOffsetsResponse, throttle_time=NO_THROTTLE, topics=tuple(topics))


async def _handle_v0(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    async def one(topic: str, p: Any) -> tuple[int, list[int]]:
        if not allowed(broker, ctx, Operation.DESCRIBE, ResourceType.TOPIC, topic):
            return int(ErrorCode.topic_authorization_failed), []
        return await legacy.list_offsets_v0(broker, topic, int(p.partition_index), int(p.timestamp),
                                            int(p.max_num_offsets))

    results = iter(await asyncio.gather(*(one(t.name, p) for t in req.topics for p in t.partitions)))
    mod = response_module(ctx)
    topics = []
    for t in req.topics:
        partitions = []
        for p in t.partitions:
            error, offsets = next(results)
            partitions.append(make(mod.ListOffsetsPartitionResponse, partition_index=p.partition_index,
                                   error_code=ErrorCode(error), old_style_offsets=tuple(offsets)))
        topics.append(make(mod.ListOffsetsTopicResponse, name=t.name, partitions=tuple(partitions)))
    return make(mod.ListOffsetsResponse, topics=tuple(topics))
