"""Transactions end to end with librdkafka (confluent-kafka): what an application sees of commits, aborts,
consume-transform-produce, zombie fencing and the coordinator's timeout.

Every test runs against the reference first (`[reference]`: Apache Kafka 4.4.0, the `kafka_reference` fixture),
which validates the test itself, then against Kafscale on the embedded stores (`[embedded]`) and on etcd +
SeaweedFS (`[cloud]`), the brokers the rest of tests/integration uses.

* commits and aborts across partitions: a read_committed consumer sees exactly the committed records, in order
  per partition; a read_uncommitted consumer sees every record; neither sees a control record;
* consume-transform-produce with send_offsets_to_transaction, one transaction aborted and redone: the output
  holds each input exactly once and the group's committed offsets are the input's end;
* a second producer with the same transactional.id fences the first: its next commit fails fatally and its
  open transaction is aborted;
* a transaction left open past transaction.timeout.ms is aborted by the coordinator: read_committed readers
  get past it and the producer's commit fails.

Waits are poll loops with deadlines. Kafka aborts a timed-out transaction on its next check, every
transaction.abort.timed.out.transaction.cleanup.interval.ms (10 s by default, the session's reference keeps it),
so the timeout test waits up to TIMEOUT_DEADLINE_S.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.conftest import unique_topic
from tests.xdist_groups import on_reference

PARTITIONS = 3
DEADLINE_S = 30.0
TIMEOUT_DEADLINE_S = 45.0  # the coordinator's timeout: 3 s, plus Kafka's 10 s check interval, plus a loaded machine
TXN_TIMEOUT_MS = 3000

Row = tuple[int, bytes, bytes]  # partition, key, value


@pytest.fixture(params=[pytest.param("reference", marks=on_reference), "embedded",
                        pytest.param("cloud", marks=[pytest.mark.etcd, pytest.mark.seaweedfs])])
def bootstrap(request: pytest.FixtureRequest) -> str:
    """The broker under test: Apache Kafka 4.4.0 (validating the test), or Kafscale on either set of stores."""
    if request.param == "reference":
        return str(request.getfixturevalue("kafka_reference").bootstrap)
    return str(request.getfixturevalue(f"broker_{request.param}").bootstrap)


@pytest.fixture
def topic(request: pytest.FixtureRequest, bootstrap: str) -> str:
    """A new topic of PARTITIONS partitions, each with a leader."""
    return create_topic(bootstrap, unique_topic(request.node.name))


@pytest.fixture
def producers() -> Iterator[list[Producer]]:
    """The test's producers (`transactional_producer` and `plain_producer` add theirs), closed at its end: what
    is still queued is purged first (a fenced producer may never deliver it)."""
    made: list[Producer] = []
    yield made
    for producer in made:
        for step in (producer.purge, lambda p=producer: p.poll(0), producer.close):
            with contextlib.suppress(KafkaException):  # a fenced producer raises its fatal error from each
                step()


def create_topic(bootstrap: str, name: str, partitions: int = PARTITIONS) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(30)
    deadline = time.monotonic() + DEADLINE_S
    while True:  # Kafka elects the leaders a moment after CreateTopics answers
        meta = admin.list_topics(name, timeout=10).topics[name]
        if meta.error is None and len(meta.partitions) == partitions and all(
                p.leader >= 0 for p in meta.partitions.values()):
            return name
        assert time.monotonic() < deadline, (name, meta)
        time.sleep(0.05)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def transactional_producer(producers: list[Producer], bootstrap: str, txn_id: str, **config: Any) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5, **config})
    producers.append(producer)
    producer.init_transactions(DEADLINE_S)
    return producer


def plain_producer(producers: list[Producer], bootstrap: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap})
    producers.append(producer)
    return producer


def consumer(bootstrap: str, isolation: str, **config: Any) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": unique("reader"), "enable.auto.commit": False,
                     "isolation.level": isolation, "auto.offset.reset": "earliest", **config})


def read(bootstrap: str, topic: str, isolation: str, done: Callable[[list[Row]], bool],
         deadline_s: float = DEADLINE_S) -> list[Row]:
    """Every record of the topic's partitions from the beginning, in the order consumed, until `done` holds of
    them (or the deadline: the caller's assertion then shows what was missing)."""
    reader = consumer(bootstrap, isolation)
    try:
        reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        rows: list[Row] = []
        deadline = time.monotonic() + deadline_s
        while not done(rows) and time.monotonic() < deadline:
            for m in reader.consume(100, timeout=0.2):
                assert m.error() is None, m.error()
                rows.append((m.partition(), m.key(), m.value()))
        return rows
    finally:
        reader.close()


def per_partition(rows: list[Row]) -> dict[int, list[tuple[bytes, bytes]]]:
    found: dict[int, list[tuple[bytes, bytes]]] = {}
    for p, k, v in rows:
        found.setdefault(p, []).append((k, v))
    return found


def at_least(n: int) -> Callable[[list[Row]], bool]:
    return lambda rows: len(rows) >= n


# --------------------------------------------------------------------------------- commits and aborts


def test_read_committed_sees_exactly_the_committed_transactions(bootstrap: str, topic: str,
                                                                producers: list[Producer]) -> None:
    """Five transactions over three partitions, two records per partition each: the 1st, 3rd and 5th commit,
    the 2nd and 4th abort. read_committed: the committed 18, in order per partition; read_uncommitted: all 30,
    in order per partition (the aborted too, as Kafka does). No control record reaches either."""
    producer = transactional_producer(producers, bootstrap, unique("txn"))
    expected: dict[str, list[Row]] = {"committed": [], "all": []}
    for t in range(5):
        producer.begin_transaction()
        rows = [(p, f"t{t}-p{p}-{i}".encode(), f"value-{t}-{p}-{i}".encode())
                for i in range(2) for p in range(PARTITIONS)]
        for p, key, value in rows:
            producer.produce(topic, key=key, value=value, partition=p)
        producer.flush(DEADLINE_S)
        if t % 2 == 0:
            producer.commit_transaction(DEADLINE_S)
            expected["committed"] += rows
        else:
            producer.abort_transaction(DEADLINE_S)
        expected["all"] += rows

    committed = read(bootstrap, topic, "read_committed", at_least(len(expected["committed"])))
    assert per_partition(committed) == per_partition(expected["committed"])
    everything = read(bootstrap, topic, "read_uncommitted", at_least(len(expected["all"])))
    assert per_partition(everything) == per_partition(expected["all"])
    # and nothing more turns up: the last transaction (committed) ends every partition
    again = read(bootstrap, topic, "read_committed", at_least(len(expected["committed"]) + 1), 2.0)
    assert len(again) == len(expected["committed"]) == 18


# ------------------------------------------------------------------------------ consume-transform-produce


def test_consume_transform_produce_is_exactly_once(bootstrap: str, topic: str,
                                                   producers: list[Producer]) -> None:
    """A group member reads the input (30 records over three partitions) in batches; for each batch a
    transactional producer writes the records, transformed, to the output and sends the consumer's positions
    with send_offsets_to_transaction, then commits. The second batch's transaction is aborted after its records
    were written, the consumer rewinds to the group's committed offsets, and the batch is done again. At the end
    the output (read_committed) holds each input record exactly once, and the group's committed offsets are the
    input's end offsets."""
    output = create_topic(bootstrap, f"{topic}-out")
    plain = plain_producer(producers, bootstrap)
    inputs = {f"in-{i}".encode(): i % PARTITIONS for i in range(30)}
    for key, p in inputs.items():
        plain.produce(topic, key=key, value=key.upper(), partition=p)
    assert plain.flush(DEADLINE_S) == 0

    group = unique("ctp")
    source = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                       "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    producer = transactional_producer(producers, bootstrap, unique("txn"))
    try:
        source.subscribe([topic])
        processed: set[bytes] = set()
        batches = aborted = 0
        deadline = time.monotonic() + DEADLINE_S
        while len(processed) < len(inputs):
            assert time.monotonic() < deadline, (len(processed), batches, aborted)
            batch = [m for m in source.consume(10, timeout=0.5)]
            for m in batch:
                assert m.error() is None, m.error()
            if not batch:
                continue
            producer.begin_transaction()
            for m in batch:
                producer.produce(output, key=m.key(), value=b"out:" + m.value(), partition=m.partition())
            producer.send_offsets_to_transaction(source.position(source.assignment()),
                                                 source.consumer_group_metadata(), DEADLINE_S)
            batches += 1
            if batches == 2 and not aborted:
                producer.flush(DEADLINE_S)  # the records are in the log: the abort must take them out
                producer.abort_transaction(DEADLINE_S)
                aborted += 1
                rewind(source)
                continue
            producer.commit_transaction(DEADLINE_S)
            processed.update(m.key() for m in batch)
        committed = {tp.partition: tp.offset for tp in source.committed(
            [TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=DEADLINE_S)}
    finally:
        source.close()
    assert aborted == 1

    ends = {p: source_end(bootstrap, topic, p) for p in range(PARTITIONS)}
    assert ends == {p: sum(1 for q in inputs.values() if q == p) for p in range(PARTITIONS)}
    assert committed == ends

    out = read(bootstrap, output, "read_committed", at_least(len(inputs)))
    assert sorted(k for _, k, _ in out) == sorted(inputs)  # each exactly once
    assert all(v == b"out:" + k.upper() and p == inputs[k] for p, k, v in out), out
    # the aborted attempt's records are in the log, only a read_uncommitted reader sees them
    assert len(read(bootstrap, output, "read_uncommitted", at_least(len(inputs) + 1))) > len(inputs)


def rewind(source: Consumer) -> None:
    """Back to the group's committed offsets (the beginning where nothing is committed), as after an abort."""
    assignment = source.assignment()
    for tp in source.committed(assignment, timeout=DEADLINE_S):
        source.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING))


def source_end(bootstrap: str, topic: str, partition: int) -> int:
    probe = consumer(bootstrap, "read_committed")
    try:
        return int(probe.get_watermark_offsets(TopicPartition(topic, partition), timeout=DEADLINE_S,
                                               cached=False)[1])
    finally:
        probe.close()


# ---------------------------------------------------------------------------------------- fencing


def test_a_second_producer_fences_the_first(bootstrap: str, topic: str,
                                            producers: list[Producer]) -> None:
    """Producer 1 writes three records in a transaction and leaves it open; producer 2 starts with the same
    transactional.id. Producer 1's next commit fails with a fatal, fenced error; its records are aborted: a
    read_committed reader sees only producer 2's committed records, a read_uncommitted one sees both."""
    txn_id = unique("txn")
    zombie = transactional_producer(producers, bootstrap, txn_id)
    zombie.begin_transaction()
    for i in range(3):
        zombie.produce(topic, key=f"zombie-{i}".encode(), value=b"z", partition=i % PARTITIONS)
    assert zombie.flush(DEADLINE_S) == 0

    successor = transactional_producer(producers, bootstrap, txn_id)  # fences the zombie, aborts its transaction
    with pytest.raises(KafkaException) as failed:
        zombie.produce(topic, key=b"zombie-late", value=b"z", partition=0)
        zombie.commit_transaction(DEADLINE_S)
    error: KafkaError = failed.value.args[0]
    assert error.fatal(), error
    assert error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH), error

    successor.begin_transaction()
    for i in range(2):
        successor.produce(topic, key=f"successor-{i}".encode(), value=b"s", partition=i % PARTITIONS)
    successor.commit_transaction(DEADLINE_S)

    committed = read(bootstrap, topic, "read_committed", at_least(2))
    assert sorted(k for _, k, _ in committed) == [b"successor-0", b"successor-1"]
    everything = read(bootstrap, topic, "read_uncommitted", at_least(5))
    assert {k for _, k, _ in everything} >= {b"zombie-0", b"zombie-1", b"zombie-2", b"successor-0", b"successor-1"}
    assert b"zombie-late" not in {k for _, k, _ in committed}


# ---------------------------------------------------------------------------------------- timeouts


def test_the_coordinator_aborts_a_transaction_past_its_timeout(bootstrap: str, topic: str,
                                                               producers: list[Producer]) -> None:
    """A transaction (transaction.timeout.ms 3000) writes three records to partition 0 and is left open; a plain
    record follows it. A read_committed reader is held at the transaction's first offset until the coordinator
    aborts it, then reads the plain record and never the transaction's; the producer's commit then fails."""
    producer = transactional_producer(producers, bootstrap, unique("txn"), **{"transaction.timeout.ms": TXN_TIMEOUT_MS})
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, key=f"open-{i}".encode(), value=b"o", partition=0)
    assert producer.flush(DEADLINE_S) == 0
    plain = plain_producer(producers, bootstrap)
    plain.produce(topic, key=b"after", value=b"a", partition=0)
    assert plain.flush(DEADLINE_S) == 0
    began = time.monotonic()

    committed = read(bootstrap, topic, "read_committed", lambda rows: any(k == b"after" for _, k, _ in rows),
                     TIMEOUT_DEADLINE_S)
    waited = time.monotonic() - began
    assert [k for _, k, _ in committed] == [b"after"], (committed, waited)
    assert waited >= TXN_TIMEOUT_MS / 1000 - 0.5  # held back until the coordinator aborted it, not before

    with pytest.raises(KafkaException) as failed:
        producer.commit_transaction(DEADLINE_S)
    error: KafkaError = failed.value.args[0]
    assert error.code() != KafkaError.NO_ERROR, error
    assert [k for _, k, _ in read(bootstrap, topic, "read_committed", at_least(2), 2.0)] == [b"after"]
