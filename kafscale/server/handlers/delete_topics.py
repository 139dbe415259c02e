"""DeleteTopics v0-v6: metadata first (the topic vanishes for clients), then its objects."""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from kafscale.server.handlers.common import NO_THROTTLE, make, response_module
from kafscale.server.router import RequestContext, Router

if TYPE_CHECKING:
    from kafscale.broker.shard import ShardCore

API_KEY, MIN_VERSION, MAX_VERSION = 20, 0, 6
_ZERO_UUID = uuid.UUID(int=0)
log = logging.getLogger(__name__)


def register(router: Router, shard: ShardCore) -> None:
    async def delete(name: str | None, topic_id: uuid.UUID | None) -> tuple[ErrorCode, str | None, Any]:
        info = await shard.topics.get(name) if name else shard.topics.by_id.get(topic_id)  # type: ignore[arg-type]
        if info is None:
            return (ErrorCode.unknown_topic_or_partition if name else ErrorCode.unknown_topic_id), None, None
        if not await shard.topics.delete(info.name):
            return ErrorCode.unknown_topic_or_partition, None, None
        prefix = f"{shard.config.s3_namespace}/{info.name}/"
        try:
            objects = await shard.objects.list(prefix)
            await shard.objects.delete_many([o.key for o in objects])
        except Exception as e:  # metadata is gone, so leftovers are never served; say so and move on
            log.warning("topic %s deleted but removing its objects under %s failed: %s", info.name, prefix, e)
        return ErrorCode.none, None, info

    async def handle(ctx: RequestContext, req: Any) -> Any:
        mod = response_module(ctx)
        if ctx.api_version >= 6:
            wanted = [(t.name, t.topic_id) for t in req.topics]
        else:
            wanted = [(name, None) for name in req.topic_names]
        results = []
        for name, topic_id in wanted:
            code, message, info = await delete(name, topic_id)
            results.append(make(mod.DeletableTopicResult, name=info.name if info else name,
                                topic_id=info.id if info else (topic_id or _ZERO_UUID),
                                error_code=code, error_message=message))
        return make(mod.DeleteTopicsResponse, throttle_time=NO_THROTTLE, responses=tuple(results))

    router.register(API_KEY, MIN_VERSION, MAX_VERSION, handle)
