"""Transactions through the Spark source and `kafscale sql`, written by librdkafka's transactional producer:
read_committed (the default) gives exactly the committed records, nothing past an open transaction's first
offset and no markers; read_uncommitted gives every data record; a stream sees a transaction once it commits."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from kafscale.cli import main
from kafscale.pipeline.committed import read_snapshot
from kafscale.pipeline.location import Location
from tests.pipeline.conftest import Deployment, unique_topic
from tests.pipeline.kafka import create_topic

PAD = b"." * 400  # a few records fill a 16 KiB segment: the log spans many segments


def _values(label: str, n: int, partition: int) -> list[bytes]:
    return [f"{label}-{partition}-{i}".encode() for i in range(n)]


def _send(producer: Producer, topic: str, label: str, n: int, partitions: int) -> list[bytes]:
    sent = []
    for p in range(partitions):
        for value in _values(label, n, p):
            producer.produce(topic, key=value, value=value + PAD, partition=p)
            sent.append(value)
    assert producer.flush(60) == 0
    return sent


def _transactional(bootstrap: str, tid: str) -> Producer:
    # Long enough that the coordinator does not abort t2 while the Spark reads take their time on a loaded machine.
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 5,
                         "transaction.timeout.ms": 600_000})
    producer.init_transactions(60)
    return producer


def _plain(bootstrap: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5})


@dataclass
class TxnLog:
    """A topic whose every partition holds, in this order: plain records, a committed transaction (t1), the
    records of t3, those of t2, t3's abort marker (so t3's records lie below the LSO, its marker above), plain
    records written after t2 began (late), and an aborted transaction (t4). t2 is left open."""

    topic: str
    partitions: int
    sent: dict[str, list[bytes]]
    open_txn: Producer

    def values(self, *labels: str) -> list[bytes]:
        return sorted(v for label in labels for v in self.sent[label])


def build_txn_log(bootstrap: str, topic: str, partitions: int) -> TxnLog:
    create_topic(bootstrap, topic, partitions)
    plain = _plain(bootstrap)
    t1, t2, t3, t4 = (_transactional(bootstrap, f"{topic}-{name}") for name in ("t1", "t2", "t3", "t4"))
    sent: dict[str, list[bytes]] = {"plain": _send(plain, topic, "plain", 3, partitions)}
    t1.begin_transaction()
    sent["t1"] = _send(t1, topic, "t1", 4, partitions)
    t1.commit_transaction(60)
    t3.begin_transaction()
    sent["t3"] = _send(t3, topic, "t3", 3, partitions)
    t2.begin_transaction()
    sent["t2"] = _send(t2, topic, "t2", 4, partitions)
    t3.abort_transaction(60)
    sent["late"] = _send(plain, topic, "late", 2, partitions)
    t4.begin_transaction()
    sent["t4"] = _send(t4, topic, "t4", 2, partitions)
    t4.abort_transaction(60)
    return TxnLog(topic, partitions, sent, t2)


def rows(df: Any) -> list[tuple[int, int, bytes]]:
    """(partition, offset, label) of every row; the value must be the label plus the padding."""
    out = []
    for r in df.select("partition", "offset", "key", "value").collect():
        assert r.value == r.key + PAD
        out.append((r.partition, r.offset, bytes(r.key)))
    return sorted(out)


def labels(found: list[tuple[int, int, bytes]]) -> list[bytes]:
    return sorted(v for _, _, v in found)


@pytest.fixture(params=["embedded", "cloud"])
def deployment(request: pytest.FixtureRequest) -> Deployment:
    return request.getfixturevalue(f"deployment_{request.param}")


def test_read_committed_by_default_read_uncommitted_on_request(spark: Any, deployment: Deployment) -> None:
    log = build_txn_log(deployment.bootstrap, unique_topic("txn-batch"), 2)
    snap = read_snapshot(Location.from_options(deployment.options), topics=[log.topic])
    for p in range(2):
        part = snap.logs[(log.topic, p)]
        # plain 3 + t1 4 + commit marker: t3 starts at 8, t2 at 11; the LSO is t2's first offset.
        assert (part.stable, part.end) == (11, 3 + 5 + 3 + 4 + 1 + 2 + 2 + 1)
        assert [(a.first_offset, a.last_offset) for a in part.aborted] == [(8, 15), (18, 20)]

    def read(**options: str) -> Any:
        return (spark.read.format("kafscale").options(**deployment.options).option("topic", log.topic)
                .options(**options).load())

    committed = rows(read())
    # Nothing aborted (t3 lies below the LSO, t4 past it), nothing at or past the LSO (t2, late), no marker.
    assert labels(committed) == log.values("plain", "t1")
    assert all(offset < 11 for _, offset, _ in committed)
    assert rows(read(**{"kafka.isolation.level": "read_committed", "kafscale.split.bytes": "1024",
                        "kafscale.maxPartitionBytes": "1"})) == committed
    # Everything up to the high watermark but the markers (8 per partition, 2 of each transaction's markers).
    everything = rows(read(**{"kafka.isolation.level": "read_uncommitted"}))
    assert labels(everything) == log.values("plain", "t1", "t3", "t2", "late", "t4")
    assert rows(read(isolationLevel="read_uncommitted")) == everything

    log.open_txn.commit_transaction(60)
    after = rows(read())
    assert labels(after) == log.values("plain", "t1", "t2", "late")
    # The rows a read_committed Kafka consumer gets from the broker, offset for offset.
    assert after == consume_committed(deployment.bootstrap, log.topic, 2)


def consume_committed(bootstrap: str, topic: str, partitions: int, timeout: float = 60.0) -> list[tuple[int, int,
                                                                                                       bytes]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"committed-{time.time_ns()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"})
    try:
        tps = [TopicPartition(topic, p, 0) for p in range(partitions)]
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(partitions)}
        consumer.assign(tps)
        got = []
        deadline = time.monotonic() + timeout
        while True:
            positions = {tp.partition: tp.offset for tp in consumer.position(tps)}
            if all(positions[p] >= ends[p] for p in ends):
                return sorted(got)
            assert time.monotonic() < deadline, f"at {positions} of {ends}"
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                assert msg.value() == msg.key() + PAD
                got.append((msg.partition(), msg.offset(), msg.key()))
    finally:
        consumer.close()


def _end_offset(progress: dict[str, Any]) -> dict[str, dict[str, int]]:
    end = progress["sources"][0]["endOffset"]
    return json.loads(end) if isinstance(end, str) else end


@pytest.fixture
def stream_log(deployment_embedded: Deployment) -> Iterator[TxnLog]:
    log = build_txn_log(deployment_embedded.bootstrap, unique_topic("txn-stream"), 1)
    yield log


def test_a_stream_sees_a_transaction_only_once_it_commits(spark: Any, deployment_embedded: Deployment,
                                                         stream_log: TxnLog, tmp_path: Any) -> None:
    dep, log = deployment_embedded, stream_log
    seen: list[bytes] = []
    query = (spark.readStream.format("kafscale").options(**dep.options).option("topic", log.topic).load()
             .writeStream.foreachBatch(lambda df, _id: seen.extend(v for _, _, v in rows(df)))
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(processingTime="300 milliseconds").start())
    try:
        query.processAllAvailable()
        assert sorted(seen) == log.values("plain", "t1")
        assert _end_offset(query.lastProgress) == {log.topic: {"0": 11}}  # the offsets stop at the LSO

        log.open_txn.commit_transaction(60)
        query.processAllAvailable()
        assert sorted(seen) == log.values("plain", "t1", "t2", "late")

        later = _transactional(dep.bootstrap, f"{log.topic}-t5")
        later.begin_transaction()
        aborted = _send(later, log.topic, "t5", 2, 1)
        query.processAllAvailable()
        assert not set(aborted) & set(seen)
        later.abort_transaction(60)
        committed = _transactional(dep.bootstrap, f"{log.topic}-t6")
        committed.begin_transaction()
        kept = _send(committed, log.topic, "t6", 2, 1)
        committed.commit_transaction(60)
        query.processAllAvailable()
        assert sorted(seen) == sorted(log.values("plain", "t1", "t2", "late") + kept)
        assert query.exception() is None
    finally:
        query.stop()


def test_sql_reads_committed_unless_told(deployment_embedded: Deployment, spark: Any,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    dep = deployment_embedded
    log = build_txn_log(dep.bootstrap, unique_topic("txn_sql").replace("-", "_"), 1)
    query = f"SELECT count(*) AS n FROM {log.topic}"
    assert main(["sql", query, "--data-dir", dep.options["kafscale.data.dir"], "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == ["n", str(len(log.values("plain", "t1")))]
    assert main(["sql", query, "--data-dir", dep.options["kafscale.data.dir"], "--format", "csv",
                 "--isolation-level", "read_uncommitted"]) == 0
    everything = log.values("plain", "t1", "t3", "t2", "late", "t4")
    assert capsys.readouterr().out.splitlines()[-2:] == ["n", str(len(everything))]
    log.open_txn.abort_transaction(60)
