"""Topic config validation (kafscale.cluster.topic_configs): Kafka's ConfigDef rules and words for the configs
Kafscale supports, refusals by name for Kafka's others, values stored as Kafka stores them. What Kafka itself
answers is checked on the wire in tests/differential/test_configs.py."""

from __future__ import annotations

import pytest

from kafscale.cluster.topic_configs import SPECS, UNSUPPORTED, canonical, validate


@pytest.mark.parametrize(("configs", "problem"), [
    ({"no.such.config": "1"}, "Unknown topic config name: no.such.config"),
    ({"retention.ms": "soon"}, "Invalid value soon for configuration retention.ms: Not a number of type LONG"),
    ({"retention.ms": "1_000"}, "Invalid value 1_000 for configuration retention.ms: Not a number of type LONG"),
    ({"retention.ms": "-2"}, "Invalid value -2 for configuration retention.ms: Value must be at least -1"),
    ({"max.message.bytes": "2147483648"},
     "Invalid value 2147483648 for configuration max.message.bytes: Not a number of type INT"),
    ({"segment.bytes": "1048575"},
     "Invalid value 1048575 for configuration segment.bytes: Value must be at least 1048576"),
    ({"compression.type": "GZIP"}, "Invalid value GZIP for configuration compression.type: String must be one of: "
                                   "uncompressed, zstd, lz4, snappy, gzip, producer"),
    ({"cleanup.policy": "delete,bogus"},
     "Invalid value bogus for configuration cleanup.policy: String must be one of: compact, delete"),
    ({"cleanup.policy": "compact"}, None), ({"cleanup.policy": "compact,delete"}, None), ({"cleanup.policy": ""}, None),
    ({"min.cleanable.dirty.ratio": "1.01"},
     "Invalid value 1.01 for configuration min.cleanable.dirty.ratio: Value must be no more than 1"),
    ({"min.cleanable.dirty.ratio": "-1e-9"},
     "Invalid value -1e-9 for configuration min.cleanable.dirty.ratio: Value must be at least 0"),
    ({"min.cleanable.dirty.ratio": "half"},
     "Invalid value half for configuration min.cleanable.dirty.ratio: Not a number of type DOUBLE"),
    ({"min.compaction.lag.ms": "7", "max.compaction.lag.ms": "6"},
     "conflict topic config setting min.compaction.lag.ms (7) > max.compaction.lag.ms (6)"),
    ({"retention.ms": None}, "Null value not supported for topic configs: retention.ms"),
    ({"retention.ms": " 5 ", "retention.bytes": "-5", "cleanup.policy": "delete , delete"}, None),
])
def test_validation_uses_kafkas_rules_and_words(configs: dict[str, str | None], problem: str | None) -> None:
    assert validate(configs) == problem


def test_kafkas_other_configs_are_refused_by_name() -> None:
    assert UNSUPPORTED.isdisjoint(SPECS)
    message = validate({"min.insync.replicas": "2"})
    assert message is not None and message.startswith("Topic config min.insync.replicas is not supported by Kafscale")


def test_values_are_stored_as_kafka_stores_them() -> None:
    assert [canonical("retention.ms", " +5 "), canonical("cleanup.policy", " delete , delete"),
            canonical("message.timestamp.type", " LogAppendTime")] == ["5", "delete", "LogAppendTime"]
    assert [canonical("min.cleanable.dirty.ratio", v) for v in (" .5 ", "1", "1e-4", "0.25d")] == [
        "0.5", "1.0", "1.0E-4", "0.25"]
