"""DescribeProducers v0: per partition, the producers its owner's producer state holds (Kafka's
ReplicaManager.activeProducerState): producer id and epoch, last sequence, last timestamp, the coordinator epoch
of its last marker, and the first offset of its open transaction (-1: none). READ on the topic, else
TOPIC_AUTHORIZATION_FAILED for each of its partitions; an unknown topic or partition is
UNKNOWN_TOPIC_OR_PARTITION. A partition led by another shard is asked of that shard (kafscale.broker.shard)."""

from __future__ import annotations

import asyncio
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.broker.txn_admin import PartitionProducers
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 61, 0, 0
# A topic-level refusal carries the error's default message (Kafka's ApiError(error)); a partition's none.
MESSAGES = {ErrorCode.topic_authorization_failed: "Topic authorization failed.",
            ErrorCode.unknown_topic_or_partition: "This server does not host this topic-partition."}


async def _refused(error: ErrorCode) -> PartitionProducers:
    return PartitionProducers(int(error))


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    jobs, refused = [], {}
    for t in req.topics:
        if not allowed(broker, ctx, Operation.READ, ResourceType.TOPIC, t.name):
            error: ErrorCode | None = ErrorCode.topic_authorization_failed
        elif await broker.topics.get(t.name) is None:
            error = ErrorCode.unknown_topic_or_partition
        else:
            error = None
        if error is not None:
            refused[t.name] = MESSAGES[error]
        jobs += [_refused(error) if error is not None else broker.describe_producers(t.name, int(p))
                 for p in t.partition_indexes]
    results = iter(await asyncio.gather(*jobs))
    topics = []
    for t in req.topics:
        partitions = []
        for p in t.partition_indexes:
            r = next(results)
            partitions.append(make(mod.PartitionResponse, partition_index=p, error_code=ErrorCode(r.error),
                                   error_message=refused.get(t.name), active_producers=tuple(
                make(mod.ProducerState, producer_id=a.producer_id, producer_epoch=a.producer_epoch,
                     last_sequence=a.last_sequence, last_timestamp=a.last_timestamp,
                     coordinator_epoch=a.coordinator_epoch, current_txn_start_offset=a.current_txn_start_offset)
                for a in r.producers)))
        topics.append(make(mod.TopicResponse, name=t.name, partitions=tuple(partitions)))
    return make(mod.DescribeProducersResponse, throttle_time=NO_THROTTLE, topics=tuple(topics))
