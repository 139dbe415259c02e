"""AlterConfigs v0-v2 (the legacy, non-incremental API): a topic's configs become exactly those given.

Configs not named revert to their defaults, as in Kafka. Broker configs are read-only here.
"""

from __future__ import annotations

import functools
from typing import Any

from kafscale.acceptor.handlers import config_resources as cr
from kafscale.acceptor.handlers.common import NO_THROTTLE, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker

API_KEY, MIN_VERSION, MAX_VERSION = 33, 0, 2


async def alter(broker: Broker, res: Any, validate_only: bool) -> None:
    for c in res.configs:
        if c.value is None:
            raise cr.refuse_null(c.name)
    await cr.alter_topic(broker, res.resource_name, {c.name: c.value for c in res.configs}, replace=True,
                         validate_only=validate_only)


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    responses = await cr.alter_each(broker, ctx, req.resources, bool(req.validate_only),
                                    functools.partial(alter, broker), mod.AlterConfigsResourceResponse)
    return make(mod.AlterConfigsResponse, throttle_time=NO_THROTTLE, responses=responses)
