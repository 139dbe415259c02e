"""Config resources shared by DescribeConfigs, AlterConfigs and IncrementalAlterConfigs.

Topics carry the configs of kafscale.cluster.topic_configs (dynamic, stored in the topic's metadata
entry); brokers expose their settings read-only (they come from `kafscale serve` flags, the same
for every shard but broker.id and the listener). Kafka's resource types and config sources apply.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import allowed, allowed_on_cluster
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.cluster import topic_configs
from kafscale.cluster.topics import TopicInfo
from kafscale.protocol.codec import make
from kafscale.security.acl import Operation, ResourceType

RESOURCE_TOPIC, RESOURCE_BROKER, RESOURCE_BROKER_LOGGER = 2, 4, 8
# ConfigSource (DescribeConfigsResponse)
SOURCE_DYNAMIC_TOPIC, SOURCE_STATIC_BROKER, SOURCE_DEFAULT = 1, 4, 5
# ConfigType (DescribeConfigs v3+)
TYPE_BOOLEAN, TYPE_STRING, TYPE_INT, TYPE_LONG, TYPE_DOUBLE, TYPE_LIST, TYPE_PASSWORD = 1, 2, 3, 5, 6, 7, 9

# topic config -> (broker-level synonym Kafka reports as its default, type, documentation)
TOPIC_CONFIGS: dict[str, tuple[str, int, str]] = {
    "retention.ms": ("log.retention.ms", TYPE_LONG,
                     "Segments whose newest record is older than this are deleted; -1 keeps them forever."),
    "retention.bytes": ("log.retention.bytes", TYPE_LONG,
                        "Oldest segments are deleted while a partition is larger than this; -1 means no limit."),
    "segment.bytes": ("log.segment.bytes", TYPE_INT,
                      "A partition's buffer is flushed as a segment once it holds this many bytes."),
    "compression.type": ("compression.type", TYPE_STRING,
                         "Codec batches are stored with; 'producer' keeps what the producer sent."),
    "cleanup.policy": ("log.cleanup.policy", TYPE_LIST,
                       "'delete' drops old segments by retention; 'compact' keeps the latest record of every key."),
    "delete.retention.ms": ("log.cleaner.delete.retention.ms", TYPE_LONG,
                            "How long a compacted topic keeps a tombstone after the cleaning that first kept it."),
    "min.cleanable.dirty.ratio": ("log.cleaner.min.cleanable.ratio", TYPE_DOUBLE,
                                  "A compacted partition is cleaned once this share of its cleanable log is dirty."),
    "min.compaction.lag.ms": ("log.cleaner.min.compaction.lag.ms", TYPE_LONG,
                              "Records younger than this are never compacted away."),
    "max.compaction.lag.ms": ("log.cleaner.max.compaction.lag.ms", TYPE_LONG,
                              "A record stays uncompacted at most this long, whatever the dirty ratio."),
    "segment.ms": ("log.roll.ms", TYPE_LONG,
                   "Accepted for compatibility: every flush closes a segment, so cleaning never waits for a roll."),
    "message.timestamp.type": ("log.message.timestamp.type", TYPE_STRING,
                               "CreateTime keeps the producer's timestamps; LogAppendTime stamps the broker's."),
    "message.timestamp.after.max.ms": ("log.message.timestamp.after.max.ms", TYPE_LONG,
                                       "A CreateTime record stamped further ahead of the broker's clock is refused."),
    "message.timestamp.before.max.ms": ("log.message.timestamp.before.max.ms", TYPE_LONG,
                                        "A CreateTime record stamped further behind the broker's clock is refused."),
    "max.message.bytes": ("message.max.bytes", TYPE_INT, "Largest record batch accepted."),
    topic_configs.VIRTUAL_PARTITIONS: (topic_configs.VIRTUAL_PARTITIONS, TYPE_INT,
                                       "The partitions clients see, over the topic's physical partitions; set at "
                                       "creation."),
}


# Kafka lists no broker default among these configs' synonyms: log.retention.ms has no default of its own (the
# week comes from log.retention.hours, which Kafka does not name there).
_NO_DEFAULT_SYNONYM = frozenset({"retention.ms", "segment.ms"})


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    name: str
    value: str | None
    source: int
    read_only: bool = False
    sensitive: bool = False
    config_type: int = TYPE_STRING
    documentation: str | None = None
    synonyms: tuple[tuple[str, str | None, int], ...] = ()  # (name, value, source), most specific first


class ConfigProblem(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def topic_defaults(broker: Broker) -> dict[str, str]:
    """Kafka reports the broker's default for configs a topic does not set."""
    return {**topic_configs.DEFAULTS, "segment.bytes": str(broker.config.segment_bytes)}


def topic_entries(broker: Broker, configs: dict[str, str]) -> list[ConfigEntry]:
    defaults = topic_defaults(broker)
    entries = []
    for name in sorted(defaults.keys() | configs.keys() & topic_configs.SPECS.keys()):
        synonym, kind, doc = TOPIC_CONFIGS.get(name, (name, TYPE_STRING, None))
        if name not in defaults:  # set at creation, with no default (kafscale.virtual.partitions)
            entries.append(ConfigEntry(name, configs[name], SOURCE_DYNAMIC_TOPIC, read_only=True, config_type=kind,
                                       documentation=doc, synonyms=((name, configs[name], SOURCE_DYNAMIC_TOPIC),)))
            continue
        default = () if name in _NO_DEFAULT_SYNONYM else ((synonym, defaults[name], SOURCE_DEFAULT),)
        if name in configs:
            entries.append(ConfigEntry(name, configs[name], SOURCE_DYNAMIC_TOPIC, config_type=kind, documentation=doc,
                                       synonyms=((name, configs[name], SOURCE_DYNAMIC_TOPIC), *default)))
        else:
            entries.append(ConfigEntry(name, defaults[name], SOURCE_DEFAULT, config_type=kind, documentation=doc,
                                       synonyms=default))
    return entries


_SECRETS = {"s3_secret_key", "s3_access_key"}


def broker_entries(broker: Broker, broker_id: int) -> list[ConfigEntry]:
    """Read-only: Kafka's names where one exists (tools look for them), then every kafscale setting."""
    cfg = broker.config
    addr = next((s for s in broker.placement.shards if s.id == broker_id), None)
    listeners = ",".join(f"{name}://{host}:{port}" for name, host, port in addr.listeners) if addr else ""
    if addr and not listeners:
        listeners = f"PLAINTEXT://{addr.host}:{addr.port}"
    kafka_names: list[tuple[str, str, int]] = [
        ("broker.id", str(broker_id), TYPE_INT),
        ("listeners", listeners, TYPE_LIST),
        ("advertised.listeners", listeners, TYPE_LIST),
        ("auto.create.topics.enable", str(cfg.auto_create_topics).lower(), TYPE_BOOLEAN),
        ("num.partitions", str(cfg.default_partitions), TYPE_INT),
        ("socket.request.max.bytes", str(cfg.max_frame_bytes), TYPE_INT),
        *((synonym, topic_defaults(broker)[topic], kind) for topic, (synonym, kind, _) in TOPIC_CONFIGS.items()
          if synonym != topic),
        ("compression.type", topic_configs.DEFAULTS["compression.type"], TYPE_STRING),
    ]
    entries = [ConfigEntry(n, v, SOURCE_STATIC_BROKER, read_only=True, config_type=t) for n, v, t in kafka_names]
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        kind = {bool: TYPE_BOOLEAN, int: TYPE_LONG, float: TYPE_DOUBLE}.get(type(value), TYPE_STRING)
        secret = f.name in _SECRETS
        entries.append(ConfigEntry(
            "kafscale." + f.name.replace("_", "."), None if secret else _text(value), SOURCE_STATIC_BROKER,
            read_only=True, sensitive=secret, config_type=TYPE_PASSWORD if secret else kind,
            documentation=f.metadata.get("help")))
    return entries


def _text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def broker_id(broker: Broker, name: str) -> int | None:
    """The broker a BROKER resource names ('' = cluster-wide default, answered as this broker)."""
    if name == "":
        return broker.shard_id
    if not name.isdigit() or all(s.id != int(name) for s in broker.placement.shards):
        raise ConfigProblem(ErrorCode.invalid_request, f"unknown broker id {name!r}")
    return int(name)


def refuse_broker_change() -> ConfigProblem:
    return ConfigProblem(ErrorCode.invalid_config,
                         "broker configs are read-only here: set them as `kafscale serve` flags"
                         " (or KAFSCALE_* variables) and restart the broker")


async def alter_topic(broker: Broker, name: str, change: dict[str, str | None], *, replace: bool,
                      validate_only: bool) -> None:
    """Set (value) or remove (None: removing a config that is not set, or not known, does nothing, as in Kafka)
    topic configs; replace=True drops every config not named (AlterConfigs). Raises ConfigProblem with Kafka's
    error code and message."""
    current = await broker.topics.get(name)
    if current is None:
        raise ConfigProblem(ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist.")
    for key, value in change.items():
        if value is None:
            continue
        problem = topic_configs.name_problem(key) or topic_configs.value_problem(key, value)
        if problem:
            raise ConfigProblem(ErrorCode.invalid_config, problem)
        change[key] = topic_configs.canonical(key, value)
    for key in topic_configs.FIXED_AT_CREATION & change.keys():
        if change[key] != current.configs.get(key):
            raise ConfigProblem(ErrorCode.invalid_config, f"topic config {key!r} is set at creation and cannot change")
    after = {**({} if replace else current.configs), **{k: v for k, v in change.items() if v is not None}}
    problem = topic_configs.combination_problem({k: v for k, v in after.items() if change.get(k, v) is not None})
    if problem:
        raise ConfigProblem(ErrorCode.invalid_config, problem)
    if validate_only:
        return

    def apply(info: TopicInfo) -> TopicInfo:
        fixed = {k: v for k, v in info.configs.items() if k in topic_configs.FIXED_AT_CREATION}
        configs = dict(fixed) if replace else dict(info.configs)
        for key, value in change.items():
            if value is None:
                configs.pop(key, None)
            else:
                configs[key] = value
        return dataclasses.replace(info, configs=configs)

    if await broker.topics.modify(name, apply) is None:
        raise ConfigProblem(ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist")


def may(broker: Broker, ctx: RequestContext, operation: Operation, resource_type: int, name: str) -> None:
    """Raises the authorization error Kafka answers for a config resource the principal may not touch."""
    if resource_type == RESOURCE_TOPIC:
        if not allowed(broker, ctx, operation, ResourceType.TOPIC, name):
            raise ConfigProblem(ErrorCode.topic_authorization_failed, f"not authorized for topic {name!r}")
    elif not allowed_on_cluster(broker, ctx, operation):
        raise ConfigProblem(ErrorCode.cluster_authorization_failed, "not authorized for the cluster")


async def alter_each(broker: Broker, ctx: RequestContext, resources: Any, validate_only: bool,
                     alter: Callable[[Any, bool], Awaitable[None]], response_class: type[Any]) -> tuple[Any, ...]:
    """Apply `alter` to each topic resource of an (Incremental)AlterConfigs request; one response entry
    each, carrying the resource's own error (one bad resource does not fail the others, as in Kafka)."""
    responses = []
    for res in resources:
        code, message = ErrorCode.none, None
        try:
            may(broker, ctx, Operation.ALTER_CONFIGS, int(res.resource_type), res.resource_name)
            _check_alterable(res)
            await alter(res, validate_only)
        except ConfigProblem as e:
            code, message = e.code, e.message
        responses.append(make(response_class, error_code=code, error_message=message,
                              resource_type=res.resource_type, resource_name=res.resource_name))
    return tuple(responses)


def _check_alterable(res: Any) -> None:
    """Only topic configs change; broker configs are read-only and each config may be named once."""
    resource_type = int(res.resource_type)
    if resource_type in (RESOURCE_BROKER, RESOURCE_BROKER_LOGGER):
        raise refuse_broker_change()
    if resource_type != RESOURCE_TOPIC:
        raise ConfigProblem(ErrorCode.invalid_request, f"resource type {resource_type} is not supported")
    names = [c.name for c in res.configs]
    if len(set(names)) != len(names):
        raise ConfigProblem(ErrorCode.invalid_request, "Error due to duplicate config keys")


def refuse_null(name: str) -> ConfigProblem:
    """A config set to null (AlterConfigs, or IncrementalAlterConfigs' SET, APPEND, SUBTRACT): Kafka's answer."""
    return ConfigProblem(ErrorCode.invalid_request, f"Null value not supported for : {name}")
