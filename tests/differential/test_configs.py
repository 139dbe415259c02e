"""Topic configs against Apache Kafka 4.4.0: DescribeConfigs (every config's value, source, sensitivity, type and
synonyms), validation on CreateTopics, AlterConfigs and IncrementalAlterConfigs (codes and messages), and the admin
requests with validate_only.

Kafscale supports a subset of Kafka's topic configs (kafscale.cluster.topic_configs.SPECS); the others are refused
by name and listed in docs/compatibility.md, which the first case checks against Kafka's own list. Documentation
texts differ by intent (Kafscale describes what it does), and so does segment.bytes' default (a Kafscale segment is
one stored object: `kafscale serve --segment-bytes`, 4 MiB). Topic ids differ per broker and are not compared.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from kafscale.cluster.topic_configs import SPECS, UNSUPPORTED, VIRTUAL_PARTITIONS
from tests.differential.wire import (
    ALTER_CONFIGS,
    CREATE_PARTITIONS,
    CREATE_TOPICS,
    DESCRIBE_CONFIGS,
    INCREMENTAL_ALTER_CONFIGS,
    TIMEOUT,
    Peer,
    Peers,
    code,
    req,
    sub,
)

COMPATIBILITY = Path(__file__).resolve().parents[2] / "docs" / "compatibility.md"
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
TOPIC, BROKER = 2, 4
SUPPORTED = sorted(SPECS.keys() - {VIRTUAL_PARTITIONS})  # Kafscale's own config is not Kafka's


def describe(peer: Peer, topic: str, keys: tuple[str, ...] | None = None) -> dict[str, Any]:
    """DescribeConfigs v4 of a topic with synonyms and documentation: config name -> entry."""
    answer = peer.call(req(DESCRIBE_CONFIGS, include_synonyms=True, include_documentation=True, resources=(sub(
        DESCRIBE_CONFIGS, "DescribeConfigsResource", resource_type=TOPIC, resource_name=topic,
        configuration_keys=keys),)))
    [result] = answer.results
    assert code(result.error_code) == "NONE", (peer.name, result)
    return {c.name: c for c in result.configs}


def observable(entry: Any) -> tuple[Any, ...]:
    """What a client sees of a config entry, documentation aside (its text is each broker's own)."""
    return (entry.value, code_of_source(entry.config_source), entry.read_only, entry.is_sensitive,
            entry.config_type, [(s.name, s.value, code_of_source(s.source)) for s in entry.synonyms])


def code_of_source(source: int) -> str:
    return {1: "TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG", 3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
            4: "STATIC_BROKER_CONFIG", 5: "DEFAULT_CONFIG"}.get(int(source), str(source))


# -------------------------------------------------------------------------------------------- DescribeConfigs


def test_every_topic_config_its_default_source_and_sensitivity(peers: Peers, topic: str) -> None:
    entries = {}
    for peer in peers:
        peer.create_ready(topic, 1)
        entries[peer.name] = describe(peer, topic)
    kafka, ours = entries["kafka"], entries["kafscale"]
    # The names: Kafscale describes exactly the configs it supports, Kafka's others are the documented refusals.
    assert sorted(ours) == SUPPORTED
    assert set(kafka) - set(ours) == UNSUPPORTED
    listed = COMPATIBILITY.read_text()
    assert [name for name in sorted(UNSUPPORTED) if f"`{name}`" not in listed] == []
    for name in SUPPORTED:
        assert ours[name].documentation and kafka[name].documentation, name
    # Intended: segment.bytes defaults to the broker's segment size (4 MiB here, 1 GiB in Kafka).
    assert (kafka["segment.bytes"].value, ours["segment.bytes"].value) == ("1073741824", "4194304")
    seen = {name: {peer: observable(e[name]) for peer, e in entries.items()} for name in SUPPORTED}
    seen["segment.bytes"]["kafscale"] = observable(kafka["segment.bytes"])  # compared above
    assert {n: s["kafscale"] for n, s in seen.items()} == {n: s["kafka"] for n, s in seen.items()}
    assert observable(kafka["retention.ms"]) == ("604800000", "DEFAULT_CONFIG", False, False, 5, [])


OVERRIDES: dict[str, str | None] = {
    "retention.ms": " 5 ", "retention.bytes": "-5", "segment.bytes": "2000000", "compression.type": "zstd",
    "cleanup.policy": " compact , delete, compact", "message.timestamp.type": " LogAppendTime",
    "max.message.bytes": "+7000", "min.cleanable.dirty.ratio": " .25 ", "delete.retention.ms": "1000",
    "min.compaction.lag.ms": "5", "max.compaction.lag.ms": "+6", "segment.ms": "60000",
}  # fmt: skip


def test_configs_a_topic_sets_are_stored_as_kafka_stores_them(peers: Peers, topic: str) -> None:
    """Surrounding whitespace goes, numbers are written again, a list loses its repeats; the source is the topic's
    and the broker default follows it among the synonyms (but for retention.ms, whose broker config has none)."""
    got = {}
    for peer in peers:
        peer.create_ready(topic, 1, OVERRIDES)
        entries = describe(peer, topic)
        got[peer.name] = {name: observable(entries[name]) for name in OVERRIDES}
    assert got["kafka"]["retention.ms"] == ("5", "TOPIC_CONFIG", False, False, 5, [("retention.ms", "5",
                                                                                     "TOPIC_CONFIG")])
    assert got["kafka"]["cleanup.policy"][0] == "compact,delete"
    # Intended: the broker default among segment.bytes' synonyms is the broker's segment size.
    segment = got["kafscale"]["segment.bytes"]
    assert segment[5][1] == ("log.segment.bytes", "4194304", "DEFAULT_CONFIG")
    got["kafscale"]["segment.bytes"] = (*segment[:5], [segment[5][0], got["kafka"]["segment.bytes"][5][1]])
    assert got["kafscale"] == got["kafka"]


# ------------------------------------------------------------------------------------------------ validation

# (config, value): Kafscale applies Kafka's rule, so code and message are the same.
SAME_RULES = [
    ("no.such.config", "1"), ("retention.ms", "soon"), ("retention.ms", "5.0"), ("retention.ms", ""),
    ("retention.ms", "1_000"), ("retention.ms", "9223372036854775808"), ("retention.ms", "-2"),
    ("retention.bytes", "abc"), ("max.message.bytes", "2147483648"), ("max.message.bytes", "-1"),
    ("segment.bytes", "1048575"), ("segment.bytes", "14"), ("segment.bytes", "2147483648"),
    ("compression.type", "GZIP"), ("compression.type", "none"), ("cleanup.policy", "Delete"),
    ("cleanup.policy", "delete,bogus"), ("message.timestamp.type", "createtime"), ("retention.ms", None),
    ("min.cleanable.dirty.ratio", "1.5"), ("min.cleanable.dirty.ratio", "x"), ("min.cleanable.dirty.ratio", "-0.1"),
    ("min.cleanable.dirty.ratio", "1e-1"), ("min.cleanable.dirty.ratio", ""),
    ("min.cleanable.dirty.ratio", "NaN"), ("min.cleanable.dirty.ratio", "0x1p-2"),
    ("min.cleanable.dirty.ratio", "1f"), ("delete.retention.ms", "-1"),
    ("min.compaction.lag.ms", "-1"), ("max.compaction.lag.ms", "0"), ("segment.ms", "0"),
    ("cleanup.policy", "compact"), ("cleanup.policy", "compact,delete"), ("cleanup.policy", ""),
    ("retention.ms", "+5"), ("segment.bytes", "1048576"), ("cleanup.policy", "delete"),
]  # fmt: skip


def create_checked(peer: Peer, topic: str, configs: dict[str, str | None]) -> tuple[str, str | None]:
    entry = sub(CREATE_TOPICS, "CreatableTopic", name=topic, num_partitions=1, replication_factor=-1, assignments=(),
                configs=tuple(sub(CREATE_TOPICS, "CreatableTopicConfig", name=k, value=v) for k, v in configs.items()))
    answer = peer.call(req(CREATE_TOPICS, topics=(entry,), timeout=TIMEOUT, validate_only=True)).topics[0]
    return code(answer.error_code), answer.error_message


def test_create_topics_validates_configs_as_kafka_does(peers: Peers, topic: str) -> None:
    got = {peer.name: [create_checked(peer, topic, {name: value}) for name, value in SAME_RULES] for peer in peers}
    assert got["kafka"][0] == ("INVALID_CONFIG", "Unknown topic config name: no.such.config")
    assert got["kafka"][1] == ("INVALID_CONFIG", "Invalid value soon for configuration retention.ms: Not a number of "
                                                 "type LONG")
    assert got["kafka"][-3:] == [("NONE", None)] * 3
    assert dict(zip(SAME_RULES, got["kafscale"], strict=True)) == dict(zip(SAME_RULES, got["kafka"], strict=True))


@pytest.mark.parametrize(("name", "value"), [
    ("min.insync.replicas", "2"), ("remote.storage.enable", "false"),
])
def test_configs_kafscale_cannot_honour_are_refused(peers: Peers, topic: str, name: str, value: str) -> None:
    """Intended difference (docs/compatibility.md): Kafka accepts these; Kafscale refuses them with INVALID_CONFIG
    and a message naming the config, rather than keep a setting it would not apply."""
    got = {peer.name: create_checked(peer, topic, {name: value}) for peer in peers}
    assert got["kafka"] == ("NONE", None)
    assert got["kafscale"][0] == "INVALID_CONFIG" and name in (got["kafscale"][1] or "")


def test_the_compaction_lags_must_be_in_order(peers: Peers, topic: str) -> None:
    lags = {"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"}
    got = {peer.name: create_checked(peer, topic, lags) for peer in peers}
    assert got["kafka"] == ("INVALID_CONFIG", "conflict topic config setting min.compaction.lag.ms (10) > "
                                              "max.compaction.lag.ms (5)")
    for peer in peers:
        peer.create_ready(topic, 1, {"max.compaction.lag.ms": "5"})
        got[peer.name] = (incremental(peer, topic, [("min.compaction.lag.ms", SET, "10")]),  # type: ignore[assignment]
                          alter(peer, topic, {"min.compaction.lag.ms": "10"}))
    assert got["kafka"][0] == ("INVALID_CONFIG", "conflict topic config setting min.compaction.lag.ms (10) > "
                                                 "max.compaction.lag.ms (5)")
    assert got["kafka"][1] == ("NONE", None)  # AlterConfigs replaces every config: max goes back to its default
    assert got["kafscale"] == got["kafka"]


def alter(peer: Peer, topic: str, configs: dict[str, str | None], *, validate_only: bool = True,
          resource_type: int = TOPIC) -> tuple[str, str | None]:
    answer = peer.call(req(ALTER_CONFIGS, validate_only=validate_only, resources=(sub(
        ALTER_CONFIGS, "AlterConfigsResource", resource_type=resource_type, resource_name=topic, configs=tuple(
            sub(ALTER_CONFIGS, "AlterableConfig", name=k, value=v) for k, v in configs.items())),))).responses[0]
    return code(answer.error_code), answer.error_message


def incremental(peer: Peer, topic: str, ops: list[tuple[str, int, str | None]], *, validate_only: bool = True,
                resource_type: int = TOPIC) -> tuple[str, str | None]:
    answer = peer.call(req(INCREMENTAL_ALTER_CONFIGS, validate_only=validate_only, resources=(sub(
        INCREMENTAL_ALTER_CONFIGS, "AlterConfigsResource", resource_type=resource_type, resource_name=topic,
        configs=tuple(sub(INCREMENTAL_ALTER_CONFIGS, "AlterableConfig", name=n, config_operation=op, value=v)
                      for n, op, v in ops)),))).responses[0]
    return code(answer.error_code), answer.error_message


def alter_refusals(peer: Peer, topic: str) -> dict[str, tuple[str, str | None]]:
    peer.create_ready(topic, 1)
    missing = f"{topic}-missing"
    return {
        "alter-unknown": alter(peer, topic, {"no.such.config": "1"}),
        "alter-bad-value": alter(peer, topic, {"retention.ms": "soon"}),
        "alter-null": alter(peer, topic, {"retention.ms": None}),
        "alter-missing-topic": alter(peer, missing, {"retention.ms": "1"}),
        "alter-ok": alter(peer, topic, {"retention.ms": "1000"}),
        "set-unknown": incremental(peer, topic, [("no.such.config", SET, "1")]),
        "set-bad-value": incremental(peer, topic, [("segment.bytes", SET, "10")]),
        "set-null": incremental(peer, topic, [("retention.ms", SET, None)]),
        "delete-unknown": incremental(peer, topic, [("no.such.config", DELETE, None)]),
        "delete-unset": incremental(peer, topic, [("retention.ms", DELETE, None)]),
        "append-to-a-number": incremental(peer, topic, [("retention.ms", APPEND, "1")]),
        "subtract-from-a-string": incremental(peer, topic, [("compression.type", SUBTRACT, "gzip")]),
        "append-bad-item": incremental(peer, topic, [("cleanup.policy", APPEND, "bogus")]),
        "named-twice": incremental(peer, topic, [("retention.ms", SET, "5"), ("retention.ms", SET, "6")]),
        "set-missing-topic": incremental(peer, missing, [("retention.ms", SET, "1")]),
        "set-ok": incremental(peer, topic, [("retention.ms", SET, "1000")]),
    }


def test_alter_configs_and_incremental_alter_configs_refuse_as_kafka_does(peers: Peers, topic: str) -> None:
    got = {peer.name: alter_refusals(peer, topic) for peer in peers}
    assert got["kafka"]["alter-null"] == ("INVALID_REQUEST", "Null value not supported for : retention.ms")
    assert got["kafka"]["append-to-a-number"] == ("INVALID_CONFIG", "Can't APPEND to key retention.ms because its "
                                                                    "type is not LIST.")
    assert got["kafka"]["delete-unknown"] == got["kafka"]["alter-ok"] == ("NONE", None)
    assert got["kafscale"] == got["kafka"]


def test_alter_requests_kafscale_answers_otherwise(peers: Peers, topic: str) -> None:
    """Intended differences (docs/compatibility.md): broker configs are read-only in Kafscale (they are `kafscale
    serve` flags), so AlterConfigs on a broker is INVALID_CONFIG where Kafka changes a dynamic broker config; an
    unknown IncrementalAlterConfigs operation is INVALID_REQUEST, where Kafka fails with UNKNOWN_SERVER_ERROR."""
    got = {}
    for peer in peers:
        peer.create_ready(topic, 1)
        node = str(peer.metadata([]).brokers[0].node_id)  # each broker's own id (Kafka's is 1, Kafscale's shard 0)
        got[peer.name] = (alter(peer, node, {"log.retention.ms": "1000"}, resource_type=BROKER)[0],
                          incremental(peer, topic, [("retention.ms", 9, "1")])[0])
    assert got == {"kafka": ("NONE", "UNKNOWN_SERVER_ERROR"), "kafscale": ("INVALID_CONFIG", "INVALID_REQUEST")}


def test_what_the_alter_requests_change(peers: Peers, topic: str) -> None:
    """AlterConfigs replaces the whole set (a config not named goes back to its default); IncrementalAlterConfigs
    changes only what it names, APPEND and SUBTRACT work on list items."""
    got = {}
    for peer in peers:
        peer.create_ready(topic, 1, {"retention.ms": "1000", "compression.type": "gzip"})
        steps = [
            alter(peer, topic, {"retention.bytes": "5000"}, validate_only=False),
            incremental(peer, topic, [("max.message.bytes", SET, "9000"), ("retention.bytes", DELETE, None),
                                      ("cleanup.policy", APPEND, "delete")], validate_only=False),
        ]
        entries = describe(peer, topic)
        deadline = time.monotonic() + 15
        while peer.name == "kafka" and entries["max.message.bytes"].value != "9000" and time.monotonic() < deadline:
            # KRaft applies a config change to the broker's view after it answers (a loaded machine shows the
            # previous state for a moment); Kafscale's view is its store's, read back at once.
            time.sleep(0.1)
            entries = describe(peer, topic)
        got[peer.name] = (steps, {n: (entries[n].value, code_of_source(entries[n].config_source))
                                  for n in ("retention.ms", "retention.bytes", "compression.type",
                                            "max.message.bytes", "cleanup.policy")})
    assert got["kafka"] == ([("NONE", None)] * 2, {
        "retention.ms": ("604800000", "DEFAULT_CONFIG"), "retention.bytes": ("-1", "DEFAULT_CONFIG"),
        "compression.type": ("producer", "DEFAULT_CONFIG"), "max.message.bytes": ("9000", "TOPIC_CONFIG"),
        "cleanup.policy": ("delete", "TOPIC_CONFIG")})
    assert got["kafscale"] == got["kafka"]


# ---------------------------------------------------------------------------------------------- validate_only


def validate_only_round(peer: Peer, topic: str) -> dict[str, Any]:
    """Each admin request with validate_only first (an answer, and nothing changed), then for real."""
    entry = sub(CREATE_TOPICS, "CreatableTopic", name=topic, num_partitions=3, replication_factor=-1, assignments=(),
                configs=(sub(CREATE_TOPICS, "CreatableTopicConfig", name="retention.ms", value="1000"),))
    checked = peer.call(req(CREATE_TOPICS, topics=(entry,), timeout=TIMEOUT, validate_only=True)).topics[0]
    shown = {c.name: (c.value, code_of_source(c.config_source), c.read_only, c.is_sensitive)
             for c in checked.configs if c.name in SUPPORTED and c.name != "segment.bytes"}
    got: dict[str, Any] = {
        "create-checked": (code(checked.error_code), checked.num_partitions, checked.replication_factor, shown),
        "after-check": code(peer.metadata([topic]).topics[0].error_code),
        "delete-unchecked": code(peer.delete_topics([topic]).responses[0].error_code),
    }
    peer.create_ready(topic, 3, {"retention.ms": "1000"})
    got["create-again-checked"] = code(peer.call(req(CREATE_TOPICS, topics=(entry,), timeout=TIMEOUT,
                                                     validate_only=True)).topics[0].error_code)
    grown = peer.call(req(CREATE_PARTITIONS, timeout=TIMEOUT, validate_only=True, topics=(
        sub(CREATE_PARTITIONS, "CreatePartitionsTopic", name=topic, count=5, assignments=None),))).results[0]
    got["grow-checked"] = (code(grown.error_code), len(peer.metadata([topic]).topics[0].partitions))
    got["alter-checked"] = (alter(peer, topic, {"retention.ms": "5"}), incremental(peer, topic, [
        ("retention.ms", SET, "6")]), describe(peer, topic, ("retention.ms",))["retention.ms"].value)
    got["delete"] = code(peer.delete_topics([topic]).responses[0].error_code)
    got["delete-again"] = code(peer.delete_topics([topic]).responses[0].error_code)
    return got


def test_validate_only_answers_and_changes_nothing(peers: Peers, topic: str) -> None:
    got = {peer.name: validate_only_round(peer, topic) for peer in peers}
    assert got["kafka"]["create-checked"][:3] == ("NONE", 3, 1)
    assert got["kafka"]["after-check"] == got["kafka"]["delete-unchecked"] == "UNKNOWN_TOPIC_OR_PARTITION"
    assert got["kafka"]["grow-checked"] == ("NONE", 3)
    assert got["kafka"]["alter-checked"] == (("NONE", None), ("NONE", None), "1000")
    assert (got["kafka"]["delete"], got["kafka"]["delete-again"]) == ("NONE", "UNKNOWN_TOPIC_OR_PARTITION")
    assert got["kafscale"] == got["kafka"]
