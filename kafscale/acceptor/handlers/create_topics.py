"""CreateTopics v0-v7."""

from __future__ import annotations

import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed, allowed_on_cluster, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.cluster import topic_configs
from kafscale.cluster.topics import TopicExistsError, topic_name_problem
from kafscale.cluster.virtual import MAX_PARTITIONS as MAX_PARTITIONS
from kafscale.cluster.virtual import MappingError, OutOfRangeError
from kafscale.security.acl import Operation, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 19, 0, 7
_ZERO_UUID = uuid.UUID(int=0)


def too_many_partitions(count: int) -> tuple[ErrorCode, str]:
    """Kafka refuses more partitions than it creates in one request with POLICY_VIOLATION (its limit is 10,000 per
    request; Kafscale's is MAX_PARTITIONS per topic)."""
    return ErrorCode.policy_violation, f"Excessively large number of partitions: {count} (at most {MAX_PARTITIONS})."


def collision(broker: Broker, name: str) -> str | None:
    """Kafka refuses a name that differs from an existing topic's only in '.' against '_' (their metric names
    would be the same)."""
    if "." not in name and "_" not in name:
        return None
    flat = name.replace(".", "_")
    other = next((t for t in broker.topics.topics if t != name and t.replace(".", "_") == flat), None)
    return None if other is None else f"Topic '{name}' collides with existing topic: {other}"


async def create(broker: Broker, topic: Any, validate_only: bool) -> tuple[ErrorCode, str | None, Any]:
    name = topic.name
    problem = topic_name_problem(name) or collision(broker, name)
    if problem:
        return ErrorCode.invalid_topic_exception, problem, None
    if topic.assignments:
        return ErrorCode.invalid_request, "manual replica assignment is not supported", None
    requested = None if int(topic.num_partitions) == -1 else int(topic.num_partitions)
    if requested is not None and requested <= 0:
        return ErrorCode.invalid_partitions, "Number of partitions was set to an invalid non-positive value.", None
    if requested is not None and requested > MAX_PARTITIONS:
        return *too_many_partitions(requested), None
    if int(topic.replication_factor) == 0 or int(topic.replication_factor) < -1:
        return (ErrorCode.invalid_replication_factor,
                "Replication factor must be larger than 0, or -1 to use the default value.", None)
    configs = {c.name: c.value for c in topic.configs}
    problem = topic_configs.validate(configs)
    if problem:
        return ErrorCode.invalid_config, problem, None
    configs = {k: topic_configs.canonical(k, v) for k, v in configs.items() if v is not None}
    try:
        layout = broker.topics.layout(name, requested, broker.config.default_partitions, configs)
    except MappingError as e:
        return ErrorCode.invalid_config, str(e), None
    except OutOfRangeError as e:
        return ErrorCode.invalid_partitions, str(e), None
    if layout.partitions > MAX_PARTITIONS:
        return *too_many_partitions(layout.partitions), None
    try:
        info = await broker.topics.create(name, layout.partitions, broker.placement.accepting_ids(), layout.configs,
                                          validate_only, physical=layout.physical)
    except TopicExistsError as e:
        if e.deleting:  # as Kafka answers for a topic marked for deletion: retry once it is gone
            return ErrorCode.topic_already_exists, f"topic {name!r} is marked for deletion", None
        return ErrorCode.topic_already_exists, f"topic {name!r} already exists", None
    return ErrorCode.none, None, info


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    results = []
    seen: set[str] = set()
    on_cluster = allowed_on_cluster(broker, ctx, Operation.CREATE)
    for topic in req.topics:
        if topic.name in seen:
            code, message, info = ErrorCode.invalid_request, "topic listed twice", None
        elif not (on_cluster or allowed(broker, ctx, Operation.CREATE, ResourceType.TOPIC, topic.name)):
            code, message, info = ErrorCode.topic_authorization_failed, "not authorized to create this topic", None
        else:
            code, message, info = await create(broker, topic, bool(getattr(req, "validate_only", False)))
        seen.add(topic.name)
        configs = ()
        if info is not None and hasattr(mod, "CreatableTopicConfigs"):
            merged = {**topic_configs.DEFAULTS, **info.configs}
            configs = tuple(make(mod.CreatableTopicConfigs, name=k, value=v,
                                 read_only=k in topic_configs.FIXED_AT_CREATION,
                                 config_source=1 if k in info.configs else 5, is_sensitive=False)
                            for k, v in sorted(merged.items()))
        results.append(make(
            mod.CreatableTopicResult, name=topic.name,
            topic_id=info.id if info else _ZERO_UUID, error_code=code, error_message=message,
            num_partitions=info.partitions if info else -1, replication_factor=1 if info else -1,
            configs=configs,
        ))
    return make(mod.CreateTopicsResponse, throttle_time=NO_THROTTLE, topics=tuple(results))
