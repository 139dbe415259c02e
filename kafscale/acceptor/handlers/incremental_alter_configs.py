"""IncrementalAlterConfigs v0-v1: SET / DELETE topic configs one by one; APPEND / SUBTRACT on lists.

cleanup.policy is the only list-typed topic config (and only `delete` is supported); APPEND or
SUBTRACT on any other config is INVALID_CONFIG, as in Kafka. Broker configs are read-only here.
"""

from __future__ import annotations

import functools
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers import config_resources as cr
from kafscale.acceptor.handlers.common import NO_THROTTLE, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.cluster import topic_configs

API_KEY, MIN_VERSION, MAX_VERSION = 44, 0, 1
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3


async def alter(broker: Broker, res: Any, validate_only: bool) -> None:
    info = await broker.topics.get(res.resource_name)
    current = {**cr.topic_defaults(broker), **(info.configs if info else {})}
    change: dict[str, str | None] = {}
    for c in res.configs:
        op = int(c.config_operation)
        if op in (OP_SET, OP_APPEND, OP_SUBTRACT) and c.value is None:
            raise cr.refuse_null(c.name)
        if op == OP_SET:
            change[c.name] = c.value
        elif op == OP_DELETE:
            change[c.name] = None
        elif op in (OP_APPEND, OP_SUBTRACT):
            spec = topic_configs.SPECS.get(c.name)
            if spec is None or spec.kind != "LIST":
                verb = "APPEND" if op == OP_APPEND else "SUBTRACT"
                raise cr.ConfigProblem(ErrorCode.invalid_config,
                                       f"Can't {verb} to key {c.name} because its type is not LIST.")
            items = [v for v in (current.get(c.name) or "").split(",") if v]
            given = [v.strip() for v in c.value.split(",") if v.strip()]
            if op == OP_APPEND:
                items += [v for v in given if v not in items]
            else:
                items = [v for v in items if v not in given]
            change[c.name] = ",".join(items)
        else:
            raise cr.ConfigProblem(ErrorCode.invalid_request, f"unknown config operation {op}")
    await cr.alter_topic(broker, res.resource_name, change, replace=False, validate_only=validate_only)


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    responses = await cr.alter_each(broker, ctx, req.resources, bool(req.validate_only),
                                    functools.partial(alter, broker), mod.AlterConfigsResourceResponse)
    return make(mod.IncrementalAlterConfigsResponse, throttle_time=NO_THROTTLE, responses=responses)
