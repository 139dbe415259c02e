"""Topic configs the broker understands, their defaults and validation."""

from __future__ import annotations

from collections.abc import Callable

from kafscale.cluster.virtual import TOPIC_CONFIG as VIRTUAL_PARTITIONS

# Set at creation only: what they lay out cannot change under the data.
FIXED_AT_CREATION = frozenset({VIRTUAL_PARTITIONS})

DEFAULTS: dict[str, str] = {
    "retention.ms": "604800000",
    "retention.bytes": "-1",
    "segment.bytes": str(4 * 1024 * 1024),
    "compression.type": "producer",
    "cleanup.policy": "delete",
    "message.timestamp.type": "CreateTime",
    "max.message.bytes": "1048588",
}


def _long(minimum: int) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        try:
            n = int(value)
        except ValueError:
            return f"expected an integer, got {value!r}"
        return None if n >= minimum else f"must be >= {minimum}"
    return check


def _one_of(*allowed: str) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        return None if value in allowed else f"must be one of {', '.join(allowed)}"
    return check


VALIDATORS: dict[str, Callable[[str], str | None]] = {
    "retention.ms": _long(-1),
    "retention.bytes": _long(-1),
    "segment.bytes": _long(14),
    "compression.type": _one_of("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"),
    "cleanup.policy": _one_of("delete"),
    "message.timestamp.type": _one_of("CreateTime", "LogAppendTime"),
    "max.message.bytes": _long(0),
    # The partitions clients see over the physical ones (kafscale.cluster.virtual).
    VIRTUAL_PARTITIONS: _long(1),
}


def validate(configs: dict[str, str | None]) -> str | None:
    """An error message naming the first bad config, or None."""
    for name, value in configs.items():
        check = VALIDATORS.get(name)
        if check is None:
            return f"unsupported topic config {name!r} (supported: {', '.join(sorted(VALIDATORS))})"
        if value is None:
            return f"topic config {name!r} needs a value"
        problem = check(value)
        if problem:
            return f"invalid value {value!r} for topic config {name!r}: {problem}"
    return None
