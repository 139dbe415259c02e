"""FindCoordinator v0-v4: names the shard that hosts a group (a stable hash of its id)."""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from kafscale.server.handlers.common import NO_THROTTLE, make, response_module
from kafscale.server.router import RequestContext, Router

if TYPE_CHECKING:
    from kafscale.broker.shard import ShardCore

API_KEY, MIN_VERSION, MAX_VERSION = 10, 0, 4
KEY_TYPE_GROUP = 0


def coordinator_shard(shard: ShardCore, group_id: str) -> int:
    return zlib.crc32(group_id.encode()) % max(len(shard.shards), 1)


def register(router: Router, shard: ShardCore) -> None:
    async def handle(ctx: RequestContext, req: Any) -> Any:
        mod = response_module(ctx)
        key_type = int(getattr(req, "key_type", KEY_TYPE_GROUP))

        def locate(key: str) -> tuple[ErrorCode, Any]:
            if key_type != KEY_TYPE_GROUP:
                return ErrorCode.invalid_request, None
            return ErrorCode.none, shard.shards[coordinator_shard(shard, key)]

        if ctx.api_version >= 4:
            coordinators = []
            for key in req.coordinator_keys:
                code, s = locate(key)
                coordinators.append(make(mod.Coordinator, key=key, node_id=s.id if s else -1,
                                         host=s.host if s else "", port=s.port if s else -1,
                                         error_code=code, error_message=None))
            return make(mod.FindCoordinatorResponse, throttle_time=NO_THROTTLE, coordinators=tuple(coordinators))
        code, s = locate(req.key)
        return make(mod.FindCoordinatorResponse, throttle_time=NO_THROTTLE, error_code=code, error_message=None,
                    node_id=s.id if s else -1, host=s.host if s else "", port=s.port if s else -1)

    router.register(API_KEY, MIN_VERSION, MAX_VERSION, handle)
