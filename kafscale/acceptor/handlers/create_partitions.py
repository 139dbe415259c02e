"""CreatePartitions v0-v3: add partitions to a topic; existing partitions and their data stay as they are.

New partitions are placed on shards as CreateTopics would have placed them, and start empty at offset 0.
Kafka's messages for a count that is not an increase are kept (Kafka 4's words), since tools show them verbatim.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed, make, response_module
from kafscale.acceptor.handlers.create_topics import MAX_PARTITIONS, too_many_partitions
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.cluster.placement import spread
from kafscale.cluster.topics import TopicInfo
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 37, 0, 3


class _Refused(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def grow(broker: Broker, count: int) -> Any:
    def change(info: TopicInfo) -> TopicInfo:
        if info.physical:
            raise _Refused(ErrorCode.invalid_partitions, f"Topic has virtual partitions ({info.partitions} over "
                                                         f"{info.physical} physical): their count is fixed at "
                                                         "creation.")
        if count < info.partitions:
            raise _Refused(ErrorCode.invalid_partitions, f"The topic {info.name} currently has {info.partitions} "
                                                         f"partition(s); {count} would not be an increase.")
        if count == info.partitions:
            raise _Refused(ErrorCode.invalid_partitions, f"Topic already has {info.partitions} partition(s).")
        added = spread(info.name, count, broker.placement.accepting_ids(), first=info.partitions)
        epochs = [*info.leader_epochs, *[0] * (count - len(info.leader_epochs))]
        return dataclasses.replace(info, partitions=count, placement=[*info.placement, *added], leader_epochs=epochs)
    return change


async def create(broker: Broker, topic: Any, validate_only: bool) -> None:
    count = int(topic.count)
    if topic.assignments:
        raise _Refused(ErrorCode.invalid_request, "manual partition assignment is not supported:"
                                                  " leave assignments empty and partitions are placed on shards")
    if count > MAX_PARTITIONS:
        raise _Refused(*too_many_partitions(count))
    info = await broker.topics.get(topic.name)
    if info is None:
        raise _Refused(ErrorCode.unknown_topic_or_partition, f"topic {topic.name!r} does not exist")
    if validate_only:
        grow(broker, count)(info)
        return
    if await broker.topics.modify(topic.name, grow(broker, count)) is None:
        raise _Refused(ErrorCode.unknown_topic_or_partition, f"topic {topic.name!r} does not exist")


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    names = [t.name for t in req.topics]
    results = []
    for topic in req.topics:
        code, message = ErrorCode.none, None
        if names.count(topic.name) > 1:
            code, message = ErrorCode.invalid_request, "Duplicate topic in request."
        elif not allowed(broker, ctx, Operation.ALTER, ResourceType.TOPIC, topic.name):
            code, message = ErrorCode.topic_authorization_failed, None
        else:
            try:
                await create(broker, topic, bool(req.validate_only))
            except _Refused as e:
                code, message = e.code, e.message
        results.append(make(mod.CreatePartitionsTopicResult, name=topic.name, error_code=code,
                            error_message=message))
    return make(mod.CreatePartitionsResponse, throttle_time=NO_THROTTLE, results=tuple(results))
