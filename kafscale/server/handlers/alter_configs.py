"""AlterConfigs v0-v2 (the legacy, non-incremental API): a topic's configs become exactly those given.

Configs not named revert to their defaults, as in Kafka. Broker configs are read-only here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kafscale.server.handlers import config_resources as cr
from kafscale.server.handlers.common import NO_THROTTLE, make, response_module
from kafscale.server.router import RequestContext, Router

if TYPE_CHECKING:
    from kafscale.broker.shard import ShardCore

API_KEY, MIN_VERSION, MAX_VERSION = 33, 0, 2


def register(router: Router, shard: ShardCore) -> None:
    async def alter(res: Any, validate_only: bool) -> None:
        await cr.alter_topic(shard, res.resource_name, {c.name: c.value for c in res.configs}, replace=True,
                             validate_only=validate_only)

    async def handle(ctx: RequestContext, req: Any) -> Any:
        mod = response_module(ctx)
        responses = await cr.alter_each(req.resources, bool(req.validate_only), alter, mod.AlterConfigsResourceResponse)
        return make(mod.AlterConfigsResponse, throttle_time=NO_THROTTLE, responses=responses)

    router.register(API_KEY, MIN_VERSION, MAX_VERSION, handle)
