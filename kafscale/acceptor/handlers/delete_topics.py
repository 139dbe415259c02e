"""DeleteTopics v0-v6: metadata first (the topic vanishes for clients), then its objects."""

from __future__ import annotations

import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.cluster.topics import TopicInfo
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 20, 0, 6
_ZERO_UUID = uuid.UUID(int=0)


async def delete(broker: Broker, name: str | None, topic_id: uuid.UUID | None) -> tuple[ErrorCode, TopicInfo | None]:
    info = await broker.topics.get(name) if name else broker.topics.by_id.get(topic_id)  # type: ignore[arg-type]
    if info is None:
        return (ErrorCode.unknown_topic_or_partition if name else ErrorCode.unknown_topic_id), None
    if not await broker.delete_topic(info.name):
        return ErrorCode.unknown_topic_or_partition, None
    return ErrorCode.none, info


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    if ctx.api_version >= 6:
        wanted = [(t.name, t.topic_id) for t in req.topics]
    else:
        wanted = [(name, None) for name in req.topic_names]
    results = []
    for name, topic_id in wanted:
        known = broker.topics.by_id.get(topic_id) if topic_id and not name else None
        target = name or (known.name if known else None)
        if target is not None and not allowed(broker, ctx, Operation.DELETE, ResourceType.TOPIC, target):
            code, info = ErrorCode.topic_authorization_failed, None
        else:
            code, info = await delete(broker, name, topic_id)
        results.append(make(mod.DeletableTopicResult, name=info.name if info else name,
                            topic_id=info.id if info else (topic_id or _ZERO_UUID),
                            error_code=code, error_message=None))
    return make(mod.DeleteTopicsResponse, throttle_time=NO_THROTTLE, responses=tuple(results))
