"""Apache Kafka's Java client against kafscale, at 4.4.0, 3.9.2, 3.0.2 and 2.8.2 (tests/jvm/pom.xml).

Our driver (src/io/kafscale/jvm/Driver.java, compiled against each version) runs a scenario in one JVM; each
scenario group is run once per version, the first time a test needs it, and the tests assert on its step results:

- producer: the defaults (idempotent from 3.0: the stored batches carry a producer id), acks=0/1/all, every codec
  (the stored batches are compressed with it), each read back in order;
- groups: the range and the cooperative-sticky assignors with a second member joining (eager: everything revoked;
  cooperative: only what moves), static membership (a member that comes back under its group.instance.id gets its
  partitions in the same generation), commit and resume, offsets reset by the admin client;
- admin: topics, partitions, configs, the cluster, offsets, deleteRecords, groups and their offsets, ACLs and
  SCRAM users;
- security: produce, consume in a group and admin calls over SASL_SSL with SCRAM-SHA-512 and over mTLS, on a
  topic and a group that ACLs leave to User:alice alone (so the broker must take the client for alice, from its
  login or its certificate), a user made through alterUserScramCredentials logging in, a wrong password refused.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from kafscale.storage.batch import BatchHeader, split_batches
from tests.integration.conftest import KafkaWire
from tests.integration.pki import USER
from tests.jvm.conftest import JvmBroker
from tests.jvm.harness import CLIENT_VERSIONS, Driver, Run

pytestmark = pytest.mark.timeout(900)

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
N = 50
GROUP = {"heartbeat.interval.ms": 500, "session.timeout.ms": 10000}  # a rejoin noticed in half a second
RANGE = "org.apache.kafka.clients.consumer.RangeAssignor"
COOPERATIVE = "org.apache.kafka.clients.consumer.CooperativeStickyAssignor"


def major_minor(version: str) -> tuple[int, int]:
    major, minor, _ = version.split(".", 2)
    return int(major), int(minor)


def name(kind: str, version: str) -> str:
    return f"j{version.replace('.', '')}-{kind}-{uuid.uuid4().hex[:8]}"


@dataclass
class Scenario:
    run: Run
    names: dict[str, str]  # what the scenario called its topics, groups and users


# ------------------------------------------------------------------------------------------------ the scenarios


def producer_scenario(b: JvmBroker, version: str) -> Scenario:
    cases = ["default", "acks0", "acks1", "acksall", *CODECS]
    t = {case: name(f"p-{case}", version) for case in cases}
    steps: list[dict[str, Any]] = [
        {"name": "version", "op": "version"},
        {"name": "create", "op": "create_topics", "topics": [{"name": topic, "partitions": 1} for topic in t.values()]},
        {"name": "produce-default", "op": "produce", "topic": t["default"], "count": N},
        {"name": "produce-acks0", "op": "produce", "topic": t["acks0"], "count": N, "config": {"acks": "0"}},
        {"name": "produce-acks1", "op": "produce", "topic": t["acks1"], "count": N, "config": {"acks": "1"}},
        {"name": "produce-acksall", "op": "produce", "topic": t["acksall"], "count": N,
         "config": {"acks": "all", "enable.idempotence": "true"}},
    ]
    for codec in CODECS:  # lingering, so that batches hold many records
        steps.append({"name": f"produce-{codec}", "op": "produce", "topic": t[codec], "count": N,
                      "config": {"compression.type": codec, "linger.ms": 100}})
    for case in cases:
        steps.append({"name": f"read-{case}", "op": "consume", "topic": t[case], "expect": N})
    return Scenario(Driver(version).run(b.plaintext(), steps), t)


def groups_scenario(b: JvmBroker, version: str) -> Scenario:
    n = {k: name(k, version) for k in ("range", "coop", "static", "commit")}
    g = {k: f"{v}-group" for k, v in n.items()}

    def member(member: str, kind: str, strategy: str = RANGE, **extra: Any) -> dict[str, Any]:
        return {"name": f"open-{member}", "op": "open", "member": member, "topics": [n[kind]],
                "config": {"group.id": g[kind], "partition.assignment.strategy": strategy, "client.id": member,
                           **GROUP, **extra}}

    def poll(step: str, *members: str, **until: Any) -> dict[str, Any]:
        return {"name": step, "op": "poll", "members": list(members), **until}

    def close(member: str) -> dict[str, Any]:
        return {"name": f"close-{member}", "op": "close", "member": member}

    steps: list[dict[str, Any]] = [
        {"name": "create", "op": "create_topics", "topics": [
            {"name": n["range"], "partitions": 4}, {"name": n["coop"], "partitions": 4},
            {"name": n["static"], "partitions": 2}, {"name": n["commit"], "partitions": 1}]},
        {"name": "fill-range", "op": "produce", "topic": n["range"], "count": 40},
        {"name": "fill-coop", "op": "produce", "topic": n["coop"], "count": 40},
        {"name": "fill-static", "op": "produce", "topic": n["static"], "count": 10},
        {"name": "fill-commit", "op": "produce", "topic": n["commit"], "count": 10},
        # range: an eager assignor, a second member joins
        member("a1", "range"),
        poll("range-one", "a1", assigned=4, records=40),
        member("a2", "range"),
        poll("range-two", "a1", "a2", assigned=4),
        {"name": "range-describe", "op": "describe_groups", "groups": [g["range"]]},
        close("a1"),
        close("a2"),
        # cooperative-sticky: incremental rebalances
        member("c1", "coop", COOPERATIVE),
        poll("coop-one", "c1", assigned=4, records=40),
        member("c2", "coop", COOPERATIVE),
        poll("coop-two", "c1", "c2", assigned=4),
        {"name": "coop-describe", "op": "describe_groups", "groups": [g["coop"]]},
        close("c1"),
        poll("coop-alone", "c2", assigned=4),
        close("c2"),
        # static membership: closing does not leave the group; the same group.instance.id comes back
        member("s1", "static", **{"group.instance.id": "static-1"}),
        poll("static-first", "s1", assigned=2, records=10),
        {"name": "static-commit", "op": "commit", "member": "s1"},
        {"name": "static-describe", "op": "describe_groups", "groups": [g["static"]]},
        close("s1"),
        {"name": "static-describe-closed", "op": "describe_groups", "groups": [g["static"]]},
        member("s2", "static", **{"group.instance.id": "static-1"}),
        poll("static-again", "s2", assigned=2),
        close("s2"),
        # commit, resume from the commit, and from offsets the admin client set
        {"name": "commit-first", "op": "consume", "topic": n["commit"], "group": g["commit"], "expect": 10,
         "commit": True, "config": GROUP},
        {"name": "commit-offsets", "op": "list_group_offsets", "group": g["commit"]},
        {"name": "commit-more", "op": "produce", "topic": n["commit"], "count": 5, "value_prefix": "w"},
        {"name": "commit-resume", "op": "consume", "topic": n["commit"], "group": g["commit"], "expect": 5,
         "commit": True, "config": GROUP},
        {"name": "commit-reset", "op": "alter_group_offsets", "group": g["commit"], "offsets": {f"{n['commit']}-0": 3}},
        {"name": "commit-after-reset", "op": "consume", "topic": n["commit"], "group": g["commit"], "expect": 12,
         "config": GROUP},
    ]
    return Scenario(Driver(version).run(b.plaintext(), steps), {**n, **{f"group-{k}": v for k, v in g.items()}})


def admin_scenario(b: JvmBroker, version: str) -> Scenario:
    topic, group, tag = name("admin", version), name("admin-group", version), uuid.uuid4().hex[:8]
    bob, carol, acl_topic = f"User:bob-{tag}", f"carol-{tag}", f"acl-{tag}"
    tp0 = f"{topic}-0"
    steps: list[dict[str, Any]] = [
        {"name": "create", "op": "create_topics",
         "topics": [{"name": topic, "partitions": 3, "configs": {"retention.ms": 3600000}}]},
        {"name": "create-again", "op": "create_topics", "topics": [{"name": topic, "partitions": 3}]},
        {"name": "list", "op": "list_topics"},
        {"name": "describe", "op": "describe_topics", "topics": [topic]},
        {"name": "describe-missing", "op": "describe_topics", "topics": [f"{topic}-missing"]},
        {"name": "grow", "op": "create_partitions", "topics": {topic: 5}},
        {"name": "describe-grown", "op": "describe_topics", "topics": [topic]},
        {"name": "configs", "op": "describe_configs", "resource": "topic", "resource_name": topic,
         "keys": ["retention.ms", "cleanup.policy"]},
        {"name": "alter-configs", "op": "alter_configs", "resource": "topic", "resource_name": topic,
         "set": {"compression.type": "zstd", "max.message.bytes": 2000000}, "delete": ["retention.ms"]},
        {"name": "alter-unsupported", "op": "alter_configs", "resource": "topic", "resource_name": topic,
         "set": {"min.insync.replicas": "2"}},  # no replicas in Kafscale: refused
        {"name": "configs-altered", "op": "describe_configs", "resource": "topic", "resource_name": topic,
         "keys": ["retention.ms", "cleanup.policy", "compression.type", "max.message.bytes"]},
        {"name": "broker-configs", "op": "describe_configs", "resource": "broker",
         "resource_name": str(b.node_id)},
        {"name": "cluster", "op": "describe_cluster"},
        # acks=all: 2.8.2 defaults to acks=1, answered before the flush makes the records visible (the high
        # watermark moves at the flush, as on a replicated Kafka), and the next steps read the high watermark
        {"name": "fill", "op": "produce", "topic": topic, "partition": 0, "count": 20, "config": {"acks": "all"}},
        {"name": "earliest", "op": "list_offsets", "partitions": [tp0], "spec": "earliest"},
        {"name": "latest", "op": "list_offsets", "partitions": [tp0], "spec": "latest"},
        {"name": "delete-records", "op": "delete_records", "partitions": {tp0: 5}},
        {"name": "earliest-after", "op": "list_offsets", "partitions": [tp0], "spec": "earliest"},
        {"name": "read-after", "op": "consume", "topic": topic, "group": group, "expect": 15, "commit": True},
        {"name": "groups", "op": "list_groups"},
        {"name": "describe-group", "op": "describe_groups", "groups": [group]},
        {"name": "group-offsets", "op": "list_group_offsets", "group": group},
        {"name": "alter-group-offsets", "op": "alter_group_offsets", "group": group, "offsets": {tp0: 10}},
        {"name": "group-offsets-altered", "op": "list_group_offsets", "group": group},
        {"name": "delete-group", "op": "delete_groups", "groups": [group]},
        {"name": "groups-after", "op": "list_groups"},
        {"name": "delete-group-again", "op": "delete_groups", "groups": [group]},
        {"name": "create-acls", "op": "create_acls", "acls": [
            {"resource_type": "topic", "name": acl_topic, "principal": bob, "operation": "read"},
            {"resource_type": "topic", "name": f"{acl_topic}-", "pattern": "prefixed", "principal": bob,
             "operation": "write"},
            {"resource_type": "group", "name": acl_topic, "principal": bob, "operation": "read",
             "permission": "deny"}]},
        {"name": "acls-of-bob", "op": "describe_acls", "filter": {"principal": bob}},
        {"name": "acls-of-topic", "op": "describe_acls",
         "filter": {"resource_type": "topic", "name": acl_topic, "pattern": "literal"}},
        {"name": "delete-prefixed", "op": "delete_acls",
         "filters": [{"resource_type": "topic", "pattern": "prefixed", "principal": bob}]},
        {"name": "acls-left", "op": "describe_acls", "filter": {"principal": bob}},
        {"name": "delete-rest", "op": "delete_acls", "filters": [{"principal": bob}]},
        {"name": "acls-none", "op": "describe_acls", "filter": {"principal": bob}},
        {"name": "scram-add", "op": "alter_scram", "upsert": [
            {"user": carol, "mechanism": "SCRAM-SHA-512", "iterations": 8192, "password": "carol-1"},
            {"user": carol, "mechanism": "SCRAM-SHA-256", "iterations": 4096, "password": "carol-2"}]},
        {"name": "scram-describe", "op": "describe_scram", "users": [carol]},
        {"name": "scram-delete", "op": "alter_scram", "delete": [{"user": carol, "mechanism": "SCRAM-SHA-256"}]},
        {"name": "scram-describe-after", "op": "describe_scram", "users": [carol]},
        {"name": "scram-describe-nobody", "op": "describe_scram", "users": [f"nobody-{tag}"]},
        {"name": "delete-topic", "op": "delete_topics", "topics": [topic]},
        {"name": "list-after", "op": "list_topics"},
        {"name": "delete-topic-again", "op": "delete_topics", "topics": [topic]},
    ]
    return Scenario(Driver(version).run(b.plaintext(), steps),
                    {"topic": topic, "group": group, "bob": bob, "carol": carol, "acl_topic": acl_topic})


def security_scenario(b: JvmBroker, version: str) -> Scenario:
    """Over each secure listener, a topic and a group that only User:alice may use (ACLs): what the client does
    there works only if the broker took it for alice, from its SCRAM login or from its certificate's subject."""
    names: dict[str, str] = {"dave": f"dave-{uuid.uuid4().hex[:8]}", "dave-topic": name("s-dave", version)}
    steps: list[dict[str, Any]] = []
    for mode, settings in (("scram", b.scram()), ("mtls", b.mtls())):
        topic = names[mode] = name(f"s-{mode}", version)
        only_alice = [{"resource_type": kind, "name": resource, "principal": f"User:{USER}", "operation": "all"}
                      for kind, resource in (("topic", topic), ("group", f"{topic}-g"))]
        steps += [
            {"name": f"{mode}-create", "op": "create_topics", "topics": [{"name": topic, "partitions": 2}],
             "config": settings},
            {"name": f"{mode}-acls", "op": "create_acls", "acls": only_alice, "config": settings},
            # anyone else is refused there: once they are, the ACLs are in force (they reach the authorizer
            # through the store's watch, within a second)
            {"name": f"{mode}-anonymous", "op": "produce", "topic": topic, "count": 1, "config": b.plaintext(),
             "retry_ms": 30000, "until_error": "TopicAuthorizationException"},
            {"name": f"{mode}-produce", "op": "produce", "topic": topic, "count": 20, "config": settings},
            {"name": f"{mode}-consume", "op": "consume", "topic": topic, "group": f"{topic}-g", "expect": 20,
             "commit": True, "config": settings},
            {"name": f"{mode}-offsets", "op": "list_group_offsets", "group": f"{topic}-g", "config": settings},
            {"name": f"{mode}-cluster", "op": "describe_cluster", "config": settings},
        ]
    dave = b.scram(names["dave"], "dave-secret")
    steps += [
        {"name": "dave-add", "op": "alter_scram", "config": b.scram(),
         "upsert": [{"user": names["dave"], "mechanism": "SCRAM-SHA-512", "password": "dave-secret"}]},
        # the new credential reaches the shard through the store's watch: retried until it has
        {"name": "dave-produce", "op": "produce", "topic": names["dave-topic"], "count": 5, "config": dave,
         "retry_ms": 30000},
        {"name": "dave-consume", "op": "consume", "topic": names["dave-topic"], "expect": 5, "config": dave},
        {"name": "wrong-password", "op": "list_topics", "config": b.scram(password="not-the-password")},
    ]
    return Scenario(Driver(version).run({}, steps), names)


SCENARIOS: dict[str, Callable[[JvmBroker, str], Scenario]] = {
    "producer": producer_scenario, "groups": groups_scenario, "admin": admin_scenario, "security": security_scenario}


class Scenarios:
    """Each (scenario, version) run once, by the first test that asks; a failed run fails every test of it."""

    def __init__(self, broker: JvmBroker) -> None:
        self.broker = broker
        self.done: dict[tuple[str, str], Scenario | BaseException] = {}
        self.lock = threading.Lock()

    def get(self, scenario: str, version: str) -> Scenario:
        with self.lock:
            key = (scenario, version)
            if key not in self.done:
                try:
                    self.done[key] = SCENARIOS[scenario](self.broker, version)
                except Exception as e:
                    self.done[key] = e
            found = self.done[key]
        if isinstance(found, BaseException):
            raise AssertionError(f"the {scenario} scenario did not run on {version}") from found
        return found


@pytest.fixture(scope="module")
def scenarios(jvm_broker: JvmBroker) -> Iterator[Scenarios]:
    yield Scenarios(jvm_broker)


versions = pytest.mark.parametrize("version", CLIENT_VERSIONS)


def batches(b: JvmBroker, topic: str, partition: int = 0) -> list[BatchHeader]:
    """The headers of the batches the broker stored, as raw Fetches give them back, up to the high watermark: one
    Fetch may stop at the end of a segment (Kafka's reads one log segment), so the next starts after it."""
    found: list[BatchHeader] = []
    offset = 0
    with KafkaWire(b.port) as wire:
        while True:
            answer = wire.fetch(topic, partition, offset)
            assert answer.error_code == 0, answer
            headers = [header for _, header in split_batches(bytes(answer.records or b""))]
            found += headers
            if not headers or headers[-1].last_offset + 1 >= answer.high_watermark:
                return found
            offset = headers[-1].last_offset + 1


def values(result: dict[str, Any]) -> list[str]:
    return [r[3] for r in result["records"]]


def expected(n: int = N, prefix: str = "v") -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


# ------------------------------------------------------------------------------------------------ producer


@versions
def test_the_driver_runs_the_client_version_it_was_built_for(scenarios: Scenarios, version: str) -> None:
    run = scenarios.get("producer", version).run
    assert run.ok("version")["version"] == version
    assert set(run.ok("create")["results"].values()) == {"ok"}


@versions
def test_the_producer_with_its_defaults(scenarios: Scenarios, jvm_broker: JvmBroker, version: str) -> None:
    s = scenarios.get("producer", version)
    produced = s.run.ok("produce-default")
    assert produced["acked"] == N
    assert produced["offsets"] == [[0, i] for i in range(N)]
    assert values(s.run.ok("read-default")) == expected()
    stored = batches(jvm_broker, s.names["default"])
    assert sum(h.record_count for h in stored) == N
    # enable.idempotence is true by default from 3.0 (KIP-679): InitProducerId, then batches with sequences
    idempotent = major_minor(version) >= (3, 0)
    assert {h.producer_id >= 0 for h in stored} == {idempotent}, stored
    if idempotent:
        assert [h.base_sequence for h in stored] == [h.base_offset for h in stored]


@versions
@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_the_producer_with_acks(scenarios: Scenarios, jvm_broker: JvmBroker, version: str, acks: str) -> None:
    s = scenarios.get("producer", version)
    produced = s.run.ok(f"produce-acks{acks}")
    assert produced["acked"] == N
    if acks == "0":  # nothing comes back: the client knows no offset
        assert {offset for _, offset in produced["offsets"]} == {-1}
    else:
        assert produced["offsets"] == [[0, i] for i in range(N)]
    assert values(s.run.ok(f"read-acks{acks}")) == expected()
    if acks == "all":  # with enable.idempotence=true, on every version
        assert all(h.producer_id >= 0 for h in batches(jvm_broker, s.names["acksall"]))


@versions
@pytest.mark.parametrize("codec", list(CODECS))
def test_the_producer_with_each_codec(scenarios: Scenarios, jvm_broker: JvmBroker, version: str, codec: str) -> None:
    s = scenarios.get("producer", version)
    assert s.run.ok(f"produce-{codec}")["acked"] == N
    read = s.run.ok(f"read-{codec}")
    assert values(read) == expected()
    assert [r[1] for r in read["records"]] == list(range(N))
    stored = batches(jvm_broker, s.names[codec])
    assert {h.compression for h in stored} == {CODECS[codec]}, stored
    assert sum(h.record_count for h in stored) == N


# ------------------------------------------------------------------------------------------------ groups


def events(state: dict[str, Any], kind: str) -> list[list[str]]:
    return [e["partitions"] for e in state["events"] if e["event"] == kind]


@versions
def test_the_range_assignor_revokes_everything_when_a_member_joins(scenarios: Scenarios, version: str) -> None:
    s = scenarios.get("groups", version)
    topic = s.names["range"]
    every = [f"{topic}-{p}" for p in range(4)]
    first = s.run.ok("range-one")["members"]["a1"]
    assert first["assignment"] == every
    assert len(first["records"]) == 40
    both = s.run.ok("range-two")["members"]
    # range: each member one contiguous half of the partitions
    assert sorted([both["a1"]["assignment"], both["a2"]["assignment"]]) == [every[:2], every[2:]]
    assert events(both["a1"], "revoked")[0] == every  # eager: everything goes back first
    assert both["a1"]["generation"] == both["a2"]["generation"] > first["generation"]
    group = s.run.ok("range-describe")["groups"][s.names["group-range"]]
    assert (group["state"], group["assignor"]) == ("Stable", "range")
    assert sorted(m["client_id"] for m in group["members"]) == ["a1", "a2"]
    assert sorted(p for m in group["members"] for p in m["assignment"]) == every


@versions
def test_the_cooperative_sticky_assignor_moves_only_what_it_must(scenarios: Scenarios, version: str) -> None:
    s = scenarios.get("groups", version)
    topic = s.names["coop"]
    every = [f"{topic}-{p}" for p in range(4)]
    assert s.run.ok("coop-one")["members"]["c1"]["assignment"] == every
    both = s.run.ok("coop-two")["members"]
    c1, c2 = both["c1"], both["c2"]
    assert len(c1["assignment"]) == len(c2["assignment"]) == 2
    revoked = [p for ps in events(c1, "revoked") for p in ps]
    assert sorted(revoked) == c2["assignment"], c1["events"]  # c1 gave up exactly what c2 got, nothing more
    assert not events(c1, "lost") and not events(c2, "lost")
    group = s.run.ok("coop-describe")["groups"][s.names["group-coop"]]
    assert (group["state"], group["assignor"]) == ("Stable", "cooperative-sticky")
    alone = s.run.ok("coop-alone")["members"]["c2"]  # c1 left: c2 takes its partitions too
    assert alone["assignment"] == every
    assert not events(alone, "revoked")


@versions
def test_a_static_member_comes_back_without_a_rebalance(scenarios: Scenarios, version: str) -> None:
    s = scenarios.get("groups", version)
    group_id = s.names["group-static"]
    first = s.run.ok("static-first")["members"]["s1"]
    assert len(first["records"]) == 10
    described = s.run.ok("static-describe")["groups"][group_id]
    assert [m["instance_id"] for m in described["members"]] == ["static-1"]
    # a static member's close() sends no LeaveGroup: it stays until its session times out
    closed = s.run.ok("static-describe-closed")["groups"][group_id]
    assert closed["state"] == "Stable"
    assert [(m["instance_id"], m["member_id"]) for m in closed["members"]] == [("static-1", first["member_id"])]
    again = s.run.ok("static-again")["members"]["s2"]
    assert again["assignment"] == first["assignment"]
    assert again["generation"] == first["generation"]  # the same generation: no rebalance
    assert again["member_id"] != first["member_id"]
    assert again["records"] == []  # it resumed from the commit


@versions
def test_a_group_commits_and_resumes(scenarios: Scenarios, version: str) -> None:
    s = scenarios.get("groups", version)
    tp = f"{s.names['commit']}-0"
    assert values(s.run.ok("commit-first")) == expected(10)
    assert s.run.ok("commit-offsets")["offsets"] == {tp: 10}
    assert values(s.run.ok("commit-resume")) == expected(5, "w")
    s.run.ok("commit-reset")
    assert values(s.run.ok("commit-after-reset")) == expected(10)[3:] + expected(5, "w")


# ------------------------------------------------------------------------------------------------ admin


@versions
def test_the_admin_client_on_topics_and_partitions(scenarios: Scenarios, jvm_broker: JvmBroker, version: str) -> None:
    s = scenarios.get("admin", version)
    run, topic = s.run, s.names["topic"]
    assert run.ok("create")["results"] == {topic: "ok"}
    assert run.ok("create-again")["results"][topic]["error"] == "TopicExistsException"
    assert topic in run.ok("list")["topics"]
    described = run.ok("describe")["topics"][topic]
    assert [p["partition"] for p in described["partitions"]] == [0, 1, 2]
    assert {p["leader"] for p in described["partitions"]} == {jvm_broker.node_id}
    assert described["internal"] is False
    assert run["describe-missing"]["error"] == "UnknownTopicOrPartitionException"
    assert run.ok("grow")["results"] == {topic: "ok"}
    assert len(run.ok("describe-grown")["topics"][topic]["partitions"]) == 5
    assert run.ok("cluster")["nodes"] == [f"{jvm_broker.node_id}@{jvm_broker.at('PLAINTEXT')}"]
    assert run.ok("delete-topic")["results"] == {topic: "ok"}
    assert topic not in run.ok("list-after")["topics"]
    assert run.ok("delete-topic-again")["results"][topic]["error"] == "UnknownTopicOrPartitionException"


@versions
def test_the_admin_client_on_configs(scenarios: Scenarios, jvm_broker: JvmBroker, version: str) -> None:
    run = scenarios.get("admin", version).run
    configs = run.ok("configs")["configs"]
    assert configs["retention.ms"][:2] == ["3600000", "DYNAMIC_TOPIC_CONFIG"]
    assert configs["cleanup.policy"][0] == "delete"
    run.ok("alter-configs")
    assert run["alter-unsupported"]["error"] == "InvalidConfigurationException"
    altered = run.ok("configs-altered")["configs"]
    assert altered["compression.type"][:2] == ["zstd", "DYNAMIC_TOPIC_CONFIG"]
    assert altered["cleanup.policy"][0] == "delete"
    assert altered["max.message.bytes"][:2] == ["2000000", "DYNAMIC_TOPIC_CONFIG"]
    assert altered["retention.ms"][1] != "DYNAMIC_TOPIC_CONFIG"  # deleted: back to the default
    assert run.ok("broker-configs")["configs"], "the broker describes no config"


@versions
def test_the_admin_client_on_offsets_and_records(scenarios: Scenarios, version: str) -> None:
    s = scenarios.get("admin", version)
    run, tp0 = s.run, f"{s.names['topic']}-0"
    assert run.ok("fill")["acked"] == 20
    assert run.ok("earliest")["offsets"] == {tp0: 0}
    assert run.ok("latest")["offsets"] == {tp0: 20}
    assert run.ok("delete-records")["low_watermarks"] == {tp0: 5}
    assert run.ok("earliest-after")["offsets"] == {tp0: 5}
    assert values(run.ok("read-after")) == expected(20)[5:]


@versions
def test_the_admin_client_on_groups(scenarios: Scenarios, version: str) -> None:
    s = scenarios.get("admin", version)
    run, group, topic = s.run, s.names["group"], s.names["topic"]
    assert run.ok("groups")["groups"][group] == "Empty"
    described = run.ok("describe-group")["groups"][group]
    assert (described["state"], described["members"]) == ("Empty", [])
    # commitSync() committed the position of each of the 5 partitions; only partition 0 has records
    assert run.ok("group-offsets")["offsets"] == {f"{topic}-{p}": 20 if p == 0 else 0 for p in range(5)}
    run.ok("alter-group-offsets")
    assert run.ok("group-offsets-altered")["offsets"] == {f"{topic}-{p}": 10 if p == 0 else 0 for p in range(5)}
    assert run.ok("delete-group")["results"] == {group: "ok"}
    assert group not in run.ok("groups-after")["groups"]
    assert run.ok("delete-group-again")["results"][group]["error"] == "GroupIdNotFoundException"


@versions
def test_the_admin_client_on_acls(scenarios: Scenarios, version: str) -> None:
    s = scenarios.get("admin", version)
    run, bob, acl_topic = s.run, s.names["bob"], s.names["acl_topic"]
    assert run.ok("create-acls")["created"] == 3
    of_bob = run.ok("acls-of-bob")["acls"]
    assert sorted((a["resource_type"], a["name"], a["pattern"], a["operation"], a["permission"]) for a in of_bob) == [
        ("GROUP", acl_topic, "LITERAL", "READ", "DENY"),
        ("TOPIC", acl_topic, "LITERAL", "READ", "ALLOW"),
        ("TOPIC", f"{acl_topic}-", "PREFIXED", "WRITE", "ALLOW"),
    ]
    assert {(a["principal"], a["host"]) for a in of_bob} == {(bob, "*")}
    assert [(a["principal"], a["operation"]) for a in run.ok("acls-of-topic")["acls"]] == [(bob, "READ")]
    assert [a["name"] for a in run.ok("delete-prefixed")["deleted"]] == [f"{acl_topic}-"]
    assert len(run.ok("acls-left")["acls"]) == 2
    assert len(run.ok("delete-rest")["deleted"]) == 2
    assert run.ok("acls-none")["acls"] == []


@versions
def test_the_admin_client_on_scram_users(scenarios: Scenarios, version: str) -> None:
    s = scenarios.get("admin", version)
    run, carol = s.run, s.names["carol"]
    assert run.ok("scram-add")["users"] == {carol: "ok"}
    assert sorted(run.ok("scram-describe")["users"][carol]) == [["SCRAM-SHA-256", 4096], ["SCRAM-SHA-512", 8192]]
    assert run.ok("scram-delete")["users"] == {carol: "ok"}
    assert run.ok("scram-describe-after")["users"][carol] == [["SCRAM-SHA-512", 8192]]
    nobody = run.ok("scram-describe-nobody")["users"]
    assert [v["error"] for v in nobody.values()] == ["ResourceNotFoundException"]


# ------------------------------------------------------------------------------------------------ security


@versions
@pytest.mark.parametrize("mode", ["scram", "mtls"])
def test_produce_consume_and_admin_over_a_secure_listener(scenarios: Scenarios, jvm_broker: JvmBroker, version: str,
                                                          mode: str) -> None:
    s = scenarios.get("security", version)
    run, topic = s.run, s.names[mode]
    assert run.ok(f"{mode}-create")["results"] == {topic: "ok"}
    assert run.ok(f"{mode}-acls")["created"] == 2
    assert run[f"{mode}-anonymous"]["error"] == "TopicAuthorizationException", run[f"{mode}-anonymous"]
    assert run.ok(f"{mode}-produce")["acked"] == 20
    read = run.ok(f"{mode}-consume")
    assert sorted(values(read), key=lambda v: int(v[1:])) == expected(20)
    offsets = run.ok(f"{mode}-offsets")["offsets"]
    assert sum(offsets.values()) == 20 and set(offsets) == {f"{topic}-0", f"{topic}-1"}
    listener = {"scram": "SASL_SSL", "mtls": "SSL"}[mode]  # the addresses of the listener the client came in on
    assert run.ok(f"{mode}-cluster")["nodes"] == [f"{jvm_broker.node_id}@{jvm_broker.at(listener)}"]


@versions
def test_a_user_made_through_the_admin_client_logs_in_and_a_wrong_password_is_refused(scenarios: Scenarios,
                                                                                     version: str) -> None:
    s = scenarios.get("security", version)
    run = s.run
    assert run.ok("dave-add")["users"] == {s.names["dave"]: "ok"}
    assert run.ok("dave-produce")["acked"] == 5
    assert values(run.ok("dave-consume")) == expected(5)
    refused = run["wrong-password"]
    assert refused["error"] == "SaslAuthenticationException", refused
