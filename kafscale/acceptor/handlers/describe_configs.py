"""DescribeConfigs v0-v4: topic configs (dynamic or default) and read-only broker configs."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers import config_resources as cr
from kafscale.acceptor.handlers.common import NO_THROTTLE, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.cluster.topics import topic_name_problem
from kafscale.security.acl import Operation

API_KEY, MIN_VERSION, MAX_VERSION = 32, 0, 4


async def entries_for(broker: Broker, resource_type: int, name: str) -> list[cr.ConfigEntry]:
    if resource_type == cr.RESOURCE_TOPIC:
        problem = topic_name_problem(name)
        if problem:
            raise cr.ConfigProblem(ErrorCode.invalid_topic_exception, problem)
        info = await broker.topics.get(name)
        if info is None:
            raise cr.ConfigProblem(ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist")
        return cr.topic_entries(broker, info.configs)
    if resource_type == cr.RESOURCE_BROKER:
        return cr.broker_entries(broker, cr.broker_id(broker, name))  # type: ignore[arg-type]
    raise cr.ConfigProblem(ErrorCode.invalid_request, f"resource type {resource_type} is not supported")


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    synonyms_wanted = bool(getattr(req, "include_synonyms", False))
    docs_wanted = bool(getattr(req, "include_documentation", False))
    results = []
    for res in req.resources:
        code, message, configs = ErrorCode.none, None, ()
        try:
            cr.may(broker, ctx, Operation.DESCRIBE_CONFIGS, int(res.resource_type), res.resource_name)
            entries = await entries_for(broker, int(res.resource_type), res.resource_name)
        except cr.ConfigProblem as e:
            code, message, entries = e.code, e.message, []
        wanted = None if res.configuration_keys is None else set(res.configuration_keys)
        configs = tuple(_entry(mod, e, synonyms_wanted, docs_wanted) for e in entries
                        if wanted is None or not wanted or e.name in wanted)
        results.append(make(mod.DescribeConfigsResult, error_code=code, error_message=message,
                            resource_type=res.resource_type, resource_name=res.resource_name, configs=configs))
    return make(mod.DescribeConfigsResponse, throttle_time=NO_THROTTLE, results=tuple(results))


def _entry(mod: Any, e: cr.ConfigEntry, synonyms: bool, docs: bool) -> Any:
    syn = ()
    if synonyms and hasattr(mod, "DescribeConfigsSynonym"):
        syn = tuple(make(mod.DescribeConfigsSynonym, name=n, value=v, source=s) for n, v, s in e.synonyms)
    return make(mod.DescribeConfigsResourceResult, name=e.name, value=None if e.sensitive else e.value,
                read_only=e.read_only, is_default=e.source == cr.SOURCE_DEFAULT, config_source=e.source,
                is_sensitive=e.sensitive, synonyms=syn, config_type=e.config_type,
                documentation=e.documentation if docs else None)
