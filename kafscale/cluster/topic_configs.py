"""Topic configs the broker understands, their defaults and validation.

Validation is Kafka's ConfigDef for the same configs: the same types (INT is 32-bit, LONG 64-bit), minimums and
allowed strings, surrounding whitespace ignored, and a value stored the way Kafka stores it (parsed and written
again: ' 5 ' is '5', a list loses repeats). Refusals are worded as Kafka words them, since tools print them verbatim.
The configs Kafka has that Kafscale cannot honour (UNSUPPORTED: replicas, local log files, tiered storage...) are
refused by name; docs/compatibility.md lists them.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from decimal import Decimal

from kafscale.cluster.virtual import TOPIC_CONFIG as VIRTUAL_PARTITIONS

# Set at creation only: what they lay out cannot change under the data.
FIXED_AT_CREATION = frozenset({VIRTUAL_PARTITIONS})

DEFAULTS: dict[str, str] = {
    "retention.ms": "604800000",
    "retention.bytes": "-1",
    "segment.bytes": str(4 * 1024 * 1024),
    "compression.type": "producer",
    "cleanup.policy": "delete",
    # Compaction (kafscale.compaction, docs/compaction.md)
    "delete.retention.ms": "86400000",
    "min.cleanable.dirty.ratio": "0.5",
    "min.compaction.lag.ms": "0",
    "max.compaction.lag.ms": str(2**63 - 1),
    "segment.ms": "604800000",
    "message.timestamp.type": "CreateTime",
    # How far a CreateTime record's timestamp may be ahead of (after) or behind (before) the broker's clock.
    "message.timestamp.after.max.ms": "3600000",
    "message.timestamp.before.max.ms": str(2**63 - 1),
    "max.message.bytes": "1048588",
}

_RANGES = {"INT": (-(2**31), 2**31 - 1), "LONG": (-(2**63), 2**63 - 1)}
_NUMBER = re.compile(r"[+-]?[0-9]+")
# What Java's Double.parseDouble takes: decimal, and hexadecimal with a binary exponent.
_DOUBLE = re.compile(r"[+-]?(NaN|Infinity|([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?[fFdD]?)")
_HEX_DOUBLE = re.compile(r"[+-]?0[xX]([0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+[fFdD]?")


@dataclass(frozen=True, slots=True)
class Spec:
    """One config as Kafka defines it (kind: INT, LONG, DOUBLE, STRING or LIST)."""

    kind: str
    minimum: int | None = None
    maximum: int | None = None
    allowed: tuple[str, ...] = ()  # Kafka's valid strings (list items), in the order its message names them


SPECS: dict[str, Spec] = {
    "retention.ms": Spec("LONG", minimum=-1),
    "retention.bytes": Spec("LONG"),
    "segment.bytes": Spec("INT", minimum=1024 * 1024),
    "compression.type": Spec("STRING", allowed=("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")),
    "cleanup.policy": Spec("LIST", allowed=("compact", "delete")),
    "delete.retention.ms": Spec("LONG", minimum=0),
    "min.cleanable.dirty.ratio": Spec("DOUBLE", minimum=0, maximum=1),
    "min.compaction.lag.ms": Spec("LONG", minimum=0),
    "max.compaction.lag.ms": Spec("LONG", minimum=1),
    "segment.ms": Spec("LONG", minimum=1),
    "message.timestamp.type": Spec("STRING", allowed=("CreateTime", "LogAppendTime")),
    "message.timestamp.after.max.ms": Spec("LONG", minimum=0),
    "message.timestamp.before.max.ms": Spec("LONG", minimum=0),
    "max.message.bytes": Spec("INT", minimum=0),
    # The partitions clients see over the physical ones (kafscale.cluster.virtual); Kafscale's own.
    VIRTUAL_PARTITIONS: Spec("INT", minimum=1),
}

# Apache Kafka 4.4's topic configs that Kafscale refuses: replication (min.insync.replicas, unclean election,
# replication throttles), the local log files and their flushing (segments here are objects, flushed by
# `--flush-interval-ms`), tiered storage (all data is in the object store already), per-codec compression levels,
# the dead letter queue of streams groups.
UNSUPPORTED = frozenset({
    "compression.gzip.level", "compression.lz4.level", "compression.zstd.level",
    "errors.deadletterqueue.group.enable", "file.delete.delay.ms", "flush.messages", "flush.ms",
    "follower.replication.throttled.replicas", "index.interval.bytes", "leader.replication.throttled.replicas",
    "local.retention.bytes", "local.retention.ms", "max.decompressed.message.bytes",
    "min.insync.replicas", "preallocate", "remote.copy.lag.bytes", "remote.copy.lag.ms",
    "remote.log.copy.disable", "remote.log.delete.on.disable", "remote.storage.enable", "segment.index.bytes",
    "segment.jitter.ms", "unclean.leader.election.enable",
})  # fmt: skip


def policies(configs: dict[str, object]) -> tuple[str, ...]:
    """A topic's cleanup.policy items ("delete", "compact", both or none)."""
    return _policy_items(str(configs.get("cleanup.policy", DEFAULTS["cleanup.policy"])))


@functools.lru_cache(maxsize=64)
def _policy_items(value: str) -> tuple[str, ...]:
    return tuple(_items(value))  # once per distinct value: the produce path asks on every request


def _items(value: str) -> list[str]:
    """A LIST value as Kafka splits it: trimmed, commas with any whitespace around them; '' is no items."""
    text = value.strip()
    return re.split(r"\s*,\s*", text) if text else []


def value_problem(name: str, value: str) -> str | None:
    """Why Kafka (or, for what it cannot honour, Kafscale) refuses this value of a known config, or None."""
    spec = SPECS[name]
    invalid = f"Invalid value {value} for configuration {name}"
    text = value.strip()
    if spec.kind in _RANGES:
        low, high = _RANGES[spec.kind]
        if _NUMBER.fullmatch(text) is None or not low <= int(text) <= high:
            return f"{invalid}: Not a number of type {spec.kind}"
        if spec.minimum is not None and int(text) < spec.minimum:
            return f"{invalid}: Value must be at least {spec.minimum}"
        return None
    if spec.kind == "DOUBLE":
        if _DOUBLE.fullmatch(text) is None and _HEX_DOUBLE.fullmatch(text) is None:
            return f"{invalid}: Not a number of type DOUBLE"
        number = _double(text)
        if spec.minimum is not None and number < spec.minimum:  # NaN passes both, as in Kafka's Range
            return f"{invalid}: Value must be at least {spec.minimum}"
        if spec.maximum is not None and number > spec.maximum:
            return f"{invalid}: Value must be no more than {spec.maximum}"
        return None
    items = _items(value) if spec.kind == "LIST" else [text]
    for item in items:
        if item not in spec.allowed:
            return f"Invalid value {item} for configuration {name}: String must be one of: {', '.join(spec.allowed)}"
    return None


def name_problem(name: str) -> str | None:
    if name in SPECS:
        return None
    if name in UNSUPPORTED:
        return f"Topic config {name} is not supported by Kafscale (supported: {', '.join(sorted(SPECS))})"
    return f"Unknown topic config name: {name}"


def canonical(name: str, value: str) -> str:
    """A valid value as Kafka stores it: numbers and strings trimmed, a list without repeats."""
    spec = SPECS[name]
    if spec.kind in _RANGES:
        return str(int(value.strip()))
    if spec.kind == "DOUBLE":
        return java_double(_double(value.strip()))
    if spec.kind == "LIST":
        return ",".join(dict.fromkeys(_items(value)))
    return value.strip()


def _double(text: str) -> float:
    if _HEX_DOUBLE.fullmatch(text):
        return float.fromhex(text.rstrip("fFdD"))
    return float(text.rstrip("fFdD"))


def java_double(number: float) -> str:
    """A double as Java's Double.toString writes it (what Kafka stores): 0.5, 1.0, 1.0E-4, 1.5E7."""
    if number != number or abs(number) == float("inf"):
        return "NaN" if number != number else ("Infinity" if number > 0 else "-Infinity")
    if number == 0 or 1e-3 <= abs(number) < 1e7:
        return repr(number)  # the shortest digits, never in exponent form in this range
    sign, digits, exponent = Decimal(repr(number)).normalize().as_tuple()
    text = "".join(map(str, digits))
    return f"{'-' if sign else ''}{text[0]}.{text[1:] or '0'}E{len(text) - 1 + int(exponent)}"


def combination_problem(configs: dict[str, str]) -> str | None:
    """Kafka's check across configs (LogConfig.validate): the compaction lags must be in order."""
    low = int(configs.get("min.compaction.lag.ms", DEFAULTS["min.compaction.lag.ms"]))
    high = int(configs.get("max.compaction.lag.ms", DEFAULTS["max.compaction.lag.ms"]))
    if low > high:
        return f"conflict topic config setting min.compaction.lag.ms ({low}) > max.compaction.lag.ms ({high})"
    return None


def validate(configs: dict[str, str | None]) -> str | None:
    """CreateTopics' check: an error message naming the first bad config, or None."""
    for name, value in configs.items():
        problem = name_problem(name)
        if problem:
            return problem
        if value is None:
            return f"Null value not supported for topic configs: {name}"
        problem = value_problem(name, value)
        if problem:
            return problem
    return combination_problem({k: canonical(k, v) for k, v in configs.items() if v is not None})
