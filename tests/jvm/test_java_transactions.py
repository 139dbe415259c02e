"""Transactions with Apache Kafka's Java client, at 4.4.0, 3.9.2, 3.0.2 and 2.8.2, against Kafscale and, to
validate each scenario, against Apache Kafka 4.4.0 (`[reference]`, the `kafka_reference` fixture).

One driver JVM per (broker, version) runs the whole scenario (src/io/kafscale/jvm/Driver.java: the "txn_produce",
"ctp" and "fence" ops); the tests assert on its step results:

- commit and abort over three partitions from one transactional producer: a read_committed consumer reads exactly
  the committed records, in order per partition; a read_uncommitted one reads every record; neither sees a
  control record (the offsets the markers take are skipped);
- the consume-transform-produce loop with sendOffsetsToTransaction (ConsumerGroupMetadata on every version; and the
  group-id overload on the clients that still have it, before 4.0), one transaction aborted and redone: the output
  holds each input record exactly once, the group's committed offsets are the input's end;
- zombie fencing: a second producer with the same transactional.id aborts the first one's open transaction and
  fences it: the first one's next send and commit fail as the client version raises it against Kafka;
- and the same client sees the same offsets and the same errors from Kafscale as from Kafka.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.jvm.harness import CLIENT_VERSIONS, Driver, Run

pytestmark = pytest.mark.timeout(900)

BROKERS = ("reference", "kafscale")
PARTITIONS = 3
# (count, commit, value prefix): record i of a transaction goes to partition i % PARTITIONS
TRANSACTIONS = [(6, True, "c0-"), (6, False, "a1-"), (9, True, "c2-"), (3, False, "a3-"), (3, True, "c4-")]
CTP_INPUT = 30
CTP_PER_TXN = 5
FENCED = {"ProducerFencedException", "InvalidProducerEpochException"}


def major(version: str) -> int:
    return int(version.split(".", 1)[0])


def loops(version: str) -> list[str]:
    """The sendOffsetsToTransaction overloads the client has: by group id only before 4.0."""
    return ["metadata"] if major(version) >= 4 else ["metadata", "group_id"]


@dataclass
class Scenario:
    run: Run
    names: dict[str, str]


def scenario(bootstrap: str, version: str) -> Scenario:
    tag = f"j{version.replace('.', '')}-{uuid.uuid4().hex[:8]}"
    n = {"txn": f"{tag}-txn", "fence": f"{tag}-fence"}
    for loop in loops(version):
        n[f"{loop}-in"], n[f"{loop}-out"] = f"{tag}-{loop}-in", f"{tag}-{loop}-out"
    committed, uncommitted = {"isolation.level": "read_committed"}, {"isolation.level": "read_uncommitted"}

    def read(step: str, topic: str, isolation: dict[str, str]) -> dict[str, Any]:
        return {"name": step, "op": "consume", "topic": topic, "to_end": True, "config": isolation}

    steps: list[dict[str, Any]] = [
        {"name": "create", "op": "create_topics",
         "topics": [{"name": t, "partitions": 1 if k == "fence" else PARTITIONS} for k, t in n.items()]},
        {"name": "txn", "op": "txn_produce", "topic": n["txn"], "partitions": PARTITIONS,
         "transactional_id": f"{tag}-producer",
         "transactions": [{"count": c, "commit": ok, "value_prefix": p} for c, ok, p in TRANSACTIONS]},
        read("txn-committed", n["txn"], committed),
        read("txn-uncommitted", n["txn"], uncommitted),
    ]
    for loop in loops(version):
        steps += [
            {"name": f"{loop}-fill", "op": "produce", "topic": n[f"{loop}-in"], "count": CTP_INPUT,
             "value_prefix": "in", "config": {"acks": "all"}},
            {"name": f"{loop}-ctp", "op": "ctp", "input": n[f"{loop}-in"], "output": n[f"{loop}-out"],
             "group": f"{tag}-{loop}-group", "transactional_id": f"{tag}-{loop}-ctp", "per_txn": CTP_PER_TXN,
             "abort_txn": 1, "expect": CTP_INPUT, "offsets_by": loop,
             "config": {"session.timeout.ms": 10000, "heartbeat.interval.ms": 500}},
            read(f"{loop}-committed", n[f"{loop}-out"], committed),
            read(f"{loop}-uncommitted", n[f"{loop}-out"], uncommitted),
            {"name": f"{loop}-offsets", "op": "list_group_offsets", "group": f"{tag}-{loop}-group"},
        ]
    steps += [
        {"name": "fence", "op": "fence", "topic": n["fence"], "transactional_id": f"{tag}-zombie"},
        read("fence-committed", n["fence"], committed),
        read("fence-uncommitted", n["fence"], uncommitted),
    ]
    return Scenario(Driver(version).run({"bootstrap.servers": bootstrap}, steps), n)


class Scenarios:
    """Each (broker, version) run once, by the first test that asks; a failed run fails every test of it."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self.request = request
        self.done: dict[tuple[str, str], Scenario | BaseException] = {}
        self.lock = threading.Lock()

    def bootstrap(self, broker: str) -> str:
        if broker == "reference":
            return str(self.request.getfixturevalue("kafka_reference").bootstrap)
        return str(self.request.getfixturevalue("jvm_broker").at("PLAINTEXT"))

    def get(self, broker: str, version: str) -> Scenario:
        with self.lock:
            key = (broker, version)
            if key not in self.done:
                try:
                    self.done[key] = scenario(self.bootstrap(broker), version)
                except Exception as e:
                    self.done[key] = e
            found = self.done[key]
        if isinstance(found, BaseException):
            raise AssertionError(f"the transactions scenario did not run on {broker} with {version}") from found
        return found


@pytest.fixture(scope="module")
def scenarios(request: pytest.FixtureRequest) -> Iterator[Scenarios]:
    yield Scenarios(request)


versions = pytest.mark.parametrize("version", CLIENT_VERSIONS)
brokers = pytest.mark.parametrize("broker", BROKERS)


def by_partition(records: list[list[Any]]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for partition, _, _, value in records:
        out.setdefault(partition, []).append(value)
    return out


def written(prefixes: list[str]) -> dict[int, list[str]]:
    """The values TRANSACTIONS wrote with these prefixes, per partition, in order."""
    out: dict[int, list[str]] = {}
    for count, _, prefix in TRANSACTIONS:
        if prefix in prefixes:
            for i in range(count):
                out.setdefault(i % PARTITIONS, []).append(f"{prefix}{i}")
    return out


# ------------------------------------------------------------------------------------------ commit and abort


@brokers
@versions
def test_read_committed_sees_exactly_the_committed_transactions(scenarios: Scenarios, broker: str,
                                                                version: str) -> None:
    s = scenarios.get(broker, version)
    run = s.run
    outcomes = run.ok("txn")["transactions"]
    assert [o["outcome"] for o in outcomes] == ["committed" if ok else "aborted" for _, ok, _ in TRANSACTIONS]
    committed = run.ok("txn-committed")
    assert by_partition(committed["records"]) == written(["c0-", "c2-", "c4-"])
    uncommitted = run.ok("txn-uncommitted")
    assert by_partition(uncommitted["records"]) == written([p for _, _, p in TRANSACTIONS])
    # each transaction ends with a marker in each of its partitions: an offset no record has
    sent = sorted(tuple(o) for outcome in outcomes for o in outcome["offsets"])
    assert sorted((r[0], r[1]) for r in uncommitted["records"]) == sent
    for partition in range(PARTITIONS):
        offsets = [o for p, o in sent if p == partition]
        assert len(set(offsets)) == len(offsets)
        assert offsets[-1] + 2 == committed["ends"][f"{s.names['txn']}-{partition}"]  # its commit marker's


# ---------------------------------------------------------------------------------- consume-transform-produce


@brokers
@versions
@pytest.mark.parametrize("loop", ["metadata", "group_id"])
def test_consume_transform_produce_writes_each_input_once(scenarios: Scenarios, broker: str, version: str,
                                                          loop: str) -> None:
    if loop not in loops(version):
        pytest.skip(f"kafka-clients {version} has no sendOffsetsToTransaction(offsets, groupId)")
    s = scenarios.get(broker, version)
    run = s.run
    fill = run.ok(f"{loop}-fill")
    inputs = {(p, f"in{i}") for i, (p, _) in enumerate(fill["offsets"])}
    ctp = run.ok(f"{loop}-ctp")
    assert (ctp["processed"], ctp["aborted"]) == (CTP_INPUT, 1)
    out = run.ok(f"{loop}-committed")["records"]
    assert Counter((p, v) for p, _, _, v in out) == Counter((p, f"out-{v}") for p, v in inputs)
    # the aborted transaction's records are there for read_uncommitted: the redone ones twice
    redone = run.ok(f"{loop}-uncommitted")["records"]
    assert len(redone) > len(out)
    assert {(p, v) for p, _, _, v in redone} == {(p, v) for p, _, _, v in out}
    ends = Counter(p for p, _ in fill["offsets"])
    assert run.ok(f"{loop}-offsets")["offsets"] == {f"{s.names[f'{loop}-in']}-{p}": ends[p]
                                                    for p in range(PARTITIONS)}


# ---------------------------------------------------------------------------------------------------- fencing


@brokers
@versions
def test_a_second_producer_with_the_same_transactional_id_fences_the_first(scenarios: Scenarios, broker: str,
                                                                          version: str) -> None:
    run = scenarios.get(broker, version).run
    fence = run.ok("fence")
    assert fence["a0"] == 0
    assert fence["a_send"] in FENCED, fence
    assert fence["a_commit"] in FENCED | {"KafkaException"}, fence
    assert fence["b"] == [2, 3, 4]  # after a0 and the abort marker B's InitProducerId wrote
    assert [r[3] for r in run.ok("fence-committed")["records"]] == ["b0", "b1", "b2"]
    assert [r[3] for r in run.ok("fence-uncommitted")["records"]] == ["a0", "b0", "b1", "b2"]


# --------------------------------------------------------------------------------------------- as Kafka does


def normalized(s: Scenario) -> dict[str, Any]:
    """What a client sees, without the names: records as (partition, offset, value), the errors."""
    run = s.run
    out: dict[str, Any] = {}
    for step in ("txn-committed", "txn-uncommitted", "fence-committed", "fence-uncommitted"):
        out[step] = sorted((p, o, v) for p, o, _, v in run.ok(step)["records"])  # the order across partitions varies
    out["txn"] = run.ok("txn")["transactions"]
    fence = run.ok("fence")
    out["fence"] = {k: fence[k] for k in ("a0", "a_send", "a_commit", "b")}
    return out


@versions
def test_kafscale_answers_the_java_client_as_kafka_does(scenarios: Scenarios, version: str) -> None:
    assert normalized(scenarios.get("kafscale", version)) == normalized(scenarios.get("reference", version))
