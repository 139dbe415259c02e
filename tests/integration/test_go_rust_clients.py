"""Go and Rust Kafka clients (issue 32) against kafscale, each also against Apache Kafka to show the program is right.

The clients are small programs of tests/clients/ that `make test` builds once (`make go-clients rust-client`):

* from the Go module proxy, at the versions tests/clients/go/go.sum pins: franz-go (kgo + kadm; and its
  GroupTransactSession, cmd/franztxn), IBM/sarama at its default Config.Version (2.8.0), at 0.10.2.0 (Produce v2,
  message format v1) and at 0.8.2.0 (Produce v0, Fetch v0, message format v0, offsets committed without group
  membership), and segmentio/kafka-go;
* from Debian, built in GOPATH mode: sarama 1.22.1 (golang-github-shopify-sarama-dev) at its default, 0.8.2.0, and
  kafka-go 0.2.1 (golang-github-segmentio-kafka-go-dev), which speaks Produce v2 / Fetch v2 / JoinGroup v1;
* from crates.io: rskafka (pure Rust), tests/clients/rust.

Each Go program creates its topic with the client's admin API where the client has one (else the test creates it),
lists it, produces 30 records (key k-<i>, value v-<i> or null for every 7th, header h=<i>, timestamp base+i, as the
message format allows), then consumes them in a consumer group (two members, which wait until the group settled
before anything is produced, so each reads only its own partitions) or, for 0.8.2 clients, without membership; it
commits, reads back the committed offsets, the end offsets and the group's description, and prints it all as JSON.
The test checks every record (each exactly once, byte-identical, at the partition and offset the producer was
told), the offsets (contiguous from 0, end offsets equal to the counts), the assignment (the partitions split between
the members without overlap, all in one generation, as DescribeGroups also says) and the commits (as the client reads
them and as a confluent-kafka consumer of the group reads them).

The old-protocol cases run against Apache Kafka 3.9.2 (Kafka 4 removed those versions), the others against 4.4.0.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafscale.testing.kafka_reference import ReferenceKafka
from tests.integration.conftest import Cluster, unique_topic
from tests.xdist_groups import on_reference

pytestmark = pytest.mark.timeout(300)

CLIENTS = Path(__file__).resolve().parents[1] / "clients"
GO_BIN = CLIENTS / "go" / "bin"
RSKAFKA = CLIENTS / "rust" / "target" / "release" / "rskafka-roundtrip"
RECORDS = 30
PARTITIONS = 3
RUN_TIMEOUT_S = 120  # one program's whole run; the subprocess gets a little more


@dataclass(frozen=True)
class Case:
    name: str
    binary: str  # in tests/clients/go/bin
    reference: str  # the fixture of the Apache Kafka that proves the program: kafka_reference or kafka_reference_39
    version: str = ""  # sarama's Config.Version
    members: int = 2  # 0: offsets committed without joining the group
    create: bool = True  # the client creates the topic (else the test does)
    headers: bool = True  # the message format carries headers (v2)
    timestamps: bool = True  # ... and timestamps (v1 and v2)
    reports_offsets: bool = True  # the producer says where each record went
    reads_commits: bool = True  # the client reads the committed offsets back
    describes: bool = True  # the client describes the group
    protocol: str = "range"  # the assignor the group chose, where DescribeGroups names it
    compression: str = ""


CASES = [
    Case("franz-go", "franz", "kafka_reference", compression="lz4"),
    Case("sarama", "sarama", "kafka_reference", compression="snappy"),
    Case("kafka-go", "kafkago", "kafka_reference", protocol="", compression="zstd"),
    # The old protocol versions (Kafka 4.0 removed them; Kafka 3.9.2 still has them).
    Case("sarama-0.10.2.0", "sarama", "kafka_reference_39", version="0.10.2.0", headers=False),
    Case("sarama-0.8.2.0", "sarama", "kafka_reference_39", version="0.8.2.0", members=0, create=False,
         headers=False, timestamps=False, describes=False),
    Case("sarama-debian-1.22.1", "sarama-debian", "kafka_reference_39", members=0, create=False, headers=False,
         timestamps=False, describes=False),
    Case("kafka-go-debian-0.2.1", "kafkago-debian", "kafka_reference_39", members=1, headers=False,
         reports_offsets=False, reads_commits=False, describes=False),
]


def binary(path: Path) -> Path:
    assert path.is_file(), (f"{path} is missing: `make test` builds it (`make go-clients rust-client`; "
                            f"tests/clients/go and tests/clients/rust)")
    return path


def run_program(path: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """Runs one client program; its JSON result (the program exits 1 with an "error" in it when a step failed)."""
    done = subprocess.run([str(binary(path)), json.dumps(spec)], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S + 30)
    lines = done.stdout.strip().splitlines()
    assert lines, f"{path.name} printed nothing (exit {done.returncode}); stderr:\n{done.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(lines[-1])
    assert done.returncode == 0 and not result.get("error"), (
        f"{path.name} failed (exit {done.returncode}): {result.get('error')}\n"
        f"steps done: {result.get('steps')}\nstderr:\n{done.stderr[-3000:]}")
    return result


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def committed_by_group(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets as confluent-kafka reads them (a consumer of the group that does not join)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in found if tp.offset >= 0}


def expected_value(i: int) -> str | None:
    return None if i % 7 == 6 else f"v-{i}"


def check_go_result(case: Case, spec: dict[str, Any], result: dict[str, Any]) -> None:
    topic, n, base = spec["topic"], spec["records"], spec["base_ms"]
    assert result["topics"].get(topic) == PARTITIONS, result["topics"]
    assert result["created"] is case.create

    # Produced: every record once, each partition's offsets 0, 1, 2, ... where the producer reports them.
    produced = result["produced"]
    assert sorted(r["key"] for r in produced) == sorted(f"k-{i}" for i in range(n))
    if case.reports_offsets:
        where = [(r["partition"], r["offset"]) for r in produced]
        assert len(set(where)) == n, f"two records reported at one offset: {where}"
        per_partition = Counter(p for p, _ in where)
        assert {(p, o) for p, o in where} == {(p, o) for p, count in per_partition.items() for o in range(count)}
        assert set(per_partition) <= set(range(PARTITIONS))

    # Consumed: every record exactly once, byte-identical, at contiguous offsets from 0.
    consumed = result["consumed"]
    keys = Counter(r["key"] for r in consumed)
    assert keys == Counter(f"k-{i}" for i in range(n)), f"missing or repeated: {keys}"
    counts = Counter(r["partition"] for r in consumed)
    assert set(counts) <= set(range(PARTITIONS))
    assert len(counts) == PARTITIONS, f"the partitioner left a partition empty: {counts}"  # 30 keys over 3
    for p, count in counts.items():
        assert sorted(r["offset"] for r in consumed if r["partition"] == p) == list(range(count))
    for r in consumed:
        i = int(r["key"].removeprefix("k-"))
        assert r["value"] == expected_value(i), r
        assert (r.get("headers") or {}) == ({"h": str(i)} if case.headers else {}), r
        assert r["timestamp"] == (base + i if case.timestamps else 0), r
    if case.reports_offsets:
        assert {r["key"]: (r["partition"], r["offset"]) for r in produced} == \
            {r["key"]: (r["partition"], r["offset"]) for r in consumed}
    ends = {p: counts.get(p, 0) for p in range(PARTITIONS)}
    assert {int(p): o for p, o in result["end_offsets"].items()} == ends

    # The group: the members split the partitions without overlap, in one generation, and read only their own.
    if case.members > 1:
        members = result["members"]
        assert len(members) == case.members
        assert len({m["member_id"] for m in members}) == case.members
        assert len({m["generation"] for m in members}) == 1 and members[0]["generation"] > 0, members
        assigned = [p for m in members for p in m["assigned"]]
        assert sorted(assigned) == list(range(PARTITIONS)), members
        assert all(m["assigned"] for m in members), members
        for r in consumed:
            assert r["partition"] in members[r["member"]]["assigned"], (r, members)
        if case.describes:
            group = result["group"]
            assert group["state"] == "Stable", group
            if case.protocol:
                assert (group["protocol_type"], group["protocol"]) == ("consumer", case.protocol), group
            assert {m["member_id"]: m["assigned"] for m in group["members"]} == \
                {m["member_id"]: m["assigned"] for m in members}

    # The commits, as the client reads them back and as another client of the group reads them.
    if case.reads_commits:
        assert {int(p): o for p, o in result["committed"].items()} == ends
    assert committed_by_group(spec["bootstrap"], spec["group"], topic, PARTITIONS) == ends


def run_go_case(case: Case, bootstrap: str, target: str) -> dict[str, Any]:
    topic = unique_topic(f"go-{case.name}-{target}")
    spec = {"bootstrap": bootstrap, "topic": topic, "group": f"{topic}-group", "partitions": PARTITIONS,
            "records": RECORDS, "members": case.members, "version": case.version, "create": case.create,
            "timeout_s": RUN_TIMEOUT_S, "base_ms": 1_700_000_000_000 + 1000 * (uuid.uuid4().int % 1000),
            "compression": case.compression}
    if not case.create:
        create_topic(bootstrap, topic, PARTITIONS)
    result = run_program(GO_BIN / case.binary, spec)
    check_go_result(case, spec, result)
    return result


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_go_client_on_kafscale(case: Case, broker_embedded: Cluster) -> None:
    run_go_case(case, broker_embedded.bootstrap, "kafscale")


@on_reference
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_go_client_on_apache_kafka(case: Case, request: pytest.FixtureRequest) -> None:
    """The same program against Apache Kafka: what the kafscale test asserts is what Kafka does."""
    kafka: ReferenceKafka = request.getfixturevalue(case.reference)
    run_go_case(case, kafka.bootstrap, f"kafka-{kafka.version}")


# ----------------------------------------------------------------------------- franz-go GroupTransactSession

TXN_RECORDS = 300


def read_all(bootstrap: str, topic: str, isolation: str) -> list[tuple[str, str]]:
    """Every record of the topic's PARTITIONS partitions, to their ends, as (key, value), read with `isolation`."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "enable.partition.eof": True, "isolation.level": isolation})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    found: list[tuple[str, str]] = []
    ended: set[int] = set()
    deadline = time.monotonic() + 60
    try:
        while len(ended) < PARTITIONS:
            assert time.monotonic() < deadline, f"{topic}: not every partition reached its end in 60 s ({ended})"
            for m in consumer.consume(500, 0.5):
                if m.error() is None:
                    found.append((m.key().decode(), m.value().decode()))
                elif m.error().code() == KafkaError._PARTITION_EOF:
                    ended.add(m.partition())
                else:
                    raise AssertionError(m.error())
    finally:
        consumer.close()
    return found


def run_franz_txn(bootstrap: str, target: str) -> None:
    """tests/clients/go/cmd/franztxn: two members of a GroupTransactSession transform the input into the output,
    aborting every third transaction, a rebalance among them. Read committed, the output holds each input record
    transformed exactly once; the aborted output is stored (read_uncommitted shows it) but never committed; the
    group's committed offsets are the input's ends."""
    topic = unique_topic(f"go-txn-{target}")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in (topic, f"{topic}-out")]).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(TXN_RECORDS):
        producer.produce(topic, key=f"k-{i}", value=f"v-{i}")
    assert producer.flush(30) == 0
    spec = {"bootstrap": bootstrap, "topic": topic, "group": f"{topic}-group", "partitions": PARTITIONS,
            "records": TXN_RECORDS, "members": 2, "timeout_s": RUN_TIMEOUT_S}
    result = run_program(GO_BIN / "franztxn", spec)
    assert result["records_committed"] == TXN_RECORDS and result["committed_txns"] >= 3, result
    assert result["aborted_txns"] >= 1, result

    committed = read_all(bootstrap, f"{topic}-out", "read_committed")
    assert Counter(committed) == Counter((f"k-{i}", f"t-v-{i}") for i in range(TXN_RECORDS)), (
        "read_committed, the output is not each input record transformed exactly once")
    uncommitted = read_all(bootstrap, f"{topic}-out", "read_uncommitted")
    assert len(uncommitted) > TXN_RECORDS, "the aborted transactions' output is not stored, or none was aborted"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ends", "enable.auto.commit": False})
    try:
        high = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(PARTITIONS)}
    finally:
        consumer.close()
    assert sum(high.values()) == TXN_RECORDS
    assert committed_by_group(bootstrap, spec["group"], topic, PARTITIONS) == high


def test_franz_go_group_transact_session_on_kafscale(broker_embedded: Cluster) -> None:
    run_franz_txn(broker_embedded.bootstrap, "kafscale")


def test_franz_go_group_transact_session_on_apache_kafka(kafka_reference: ReferenceKafka) -> None:
    run_franz_txn(kafka_reference.bootstrap, "kafka-4.4.0")


# ------------------------------------------------------------------------------------------------------ rskafka


def run_rskafka(bootstrap: str, target: str) -> None:
    topic = unique_topic(f"rskafka-{target}")
    batch, codecs = 10, ["none", "gzip", "snappy", "lz4", "zstd"]
    base = 1_700_000_000_000
    spec = {"bootstrap": bootstrap, "topic": topic, "partitions": 2, "batch": batch, "base_ms": base,
            "timeout_s": RUN_TIMEOUT_S}
    result = run_program(RSKAFKA, spec)
    assert result["topics"] == [{"name": topic, "partitions": [0, 1]}]
    assert [p["partition"] for p in result["partitions"]] == [0, 1]
    total = batch * len(codecs)
    for part in result["partitions"]:
        p = part["partition"]
        # One produce request per codec, each answered with the next offsets of the partition.
        assert [b["codec"] for b in part["produced"]] == codecs
        assert [b["offsets"] for b in part["produced"]] == \
            [list(range(k * batch, (k + 1) * batch)) for k in range(len(codecs))]
        assert (part["earliest"], part["latest"], part["high_watermark"]) == (0, total, total)
        assert [r["offset"] for r in part["records"]] == list(range(total))
        for r in part["records"]:
            i = r["offset"]
            assert r == {"offset": i, "key": f"k-{p}-{i}", "value": None if i % 7 == 6 else f"v-{p}-{i}",
                         "headers": {"h": str(i)}, "timestamp": base + i}


def test_rskafka_on_kafscale(broker_embedded: Cluster) -> None:
    run_rskafka(broker_embedded.bootstrap, "kafscale")


def test_rskafka_on_apache_kafka(kafka_reference: ReferenceKafka) -> None:
    run_rskafka(kafka_reference.bootstrap, "kafka-4.4.0")
