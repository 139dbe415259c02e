"""Transactional writers and read_committed readers for the crash tests and the Jepsen-style checker
(tests/integration/test_transactions_crashes.py, test_transactions_checker.py), and the checks on what the
readers saw.

A writer (`TxnWriter`, a thread with its own transactional.id) runs transactions of a few records over a few
partitions and decides commit or abort at random (seeded). It records each transaction's outcome as the client
learned it:

* `committed`: commit_transaction returned;
* `aborted`: abort_transaction returned (the coordinator ended it as aborted);
* `not_committed`: commit was never asked for (a failure before it; whatever happened, no commit can follow);
* `unknown`: commit was asked for and then failed (the outcome is not known: it may be either, but whole).

Every record's value is `w<writer>|t<txn>|p<partition>|i<index>`, so a reader's record names its transaction.
`check` asserts, for what one reader read (in order, per partition): no record of an aborted or never-committed
transaction; every committed transaction whole, in every partition; an unknown transaction whole or absent;
no record twice; each writer's records in their writing order per partition.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

COMMITTED, ABORTED, NOT_COMMITTED, UNKNOWN = "committed", "aborted", "not_committed", "unknown"


def create_topic(bootstrap: str, topic: str, partitions: int, deadline_s: float = 60) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(deadline_s)
    deadline = time.monotonic() + deadline_s
    while True:
        meta = admin.list_topics(topic, timeout=10).topics[topic]
        if meta.error is None and len(meta.partitions) == partitions and all(
                p.leader >= 0 for p in meta.partitions.values()):
            return
        assert time.monotonic() < deadline, meta
        time.sleep(0.1)


def value(writer: int, txn: int, partition: int, index: int) -> bytes:
    return f"w{writer}|t{txn}|p{partition}|i{index}".encode()


def parse(raw: bytes) -> tuple[int, int, int, int]:
    w, t, p, i = raw.decode().split("|")
    return int(w[1:]), int(t[1:]), int(p[1:]), int(i[1:])


def transactional_producer(bootstrap: str, txn_id: str, **config: Any) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5,
                     "message.timeout.ms": 60_000, "socket.connection.setup.timeout.ms": 5_000,
                     "reconnect.backoff.max.ms": 500, **config})


def close_quietly(producer: Producer | None) -> None:
    if producer is None:
        return
    for step in (producer.purge, lambda: producer.poll(0), lambda: producer.flush(0)):
        with contextlib.suppress(KafkaException, RuntimeError):
            step()


@dataclass
class TxnWriter:
    """One transactional.id's writer thread: transactions until stopped, each outcome recorded."""

    bootstrap: str
    topic: str
    partitions: int
    writer: int
    seed: int
    txn_id: str = ""
    per_txn: int = 2  # partitions per transaction
    records: int = 2  # records per partition per transaction
    commit_rate: float = 0.6
    op_timeout_s: float = 30.0
    pause_s: float = 0.0
    config: dict[str, Any] = field(default_factory=dict)
    outcomes: dict[int, str] = field(default_factory=dict)
    written: dict[int, list[tuple[int, bytes]]] = field(default_factory=dict)  # txn -> (partition, value)s
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.txn_id = self.txn_id or f"jepsen-{self.writer}-{self.seed}"
        self._stop = threading.Event()
        self._rng = random.Random(self.seed)
        self._thread = threading.Thread(target=self._run, name=f"txn-writer-{self.writer}", daemon=True)
        self.producer: Producer | None = None

    def start(self) -> TxnWriter:
        self._thread.start()
        return self

    def stop(self, timeout: float = 120) -> None:
        self._stop.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"writer {self.writer} did not stop"

    def count(self, outcome: str) -> int:
        return sum(1 for o in self.outcomes.values() if o == outcome)

    def _new_producer(self) -> Producer:
        close_quietly(self.producer)
        self.producer = None
        producer = transactional_producer(self.bootstrap, self.txn_id, **self.config)
        deadline = time.monotonic() + 4 * self.op_timeout_s
        while True:
            try:
                producer.init_transactions(self.op_timeout_s)
                self.producer = producer
                return producer
            except KafkaException as e:
                err: KafkaError = e.args[0]
                self.errors.append(f"init: {err}")
                if err.fatal() or time.monotonic() > deadline or self._stop.is_set():
                    close_quietly(producer)
                    raise
                time.sleep(0.2)  # retriable: the coordinator is moving or loading

    def _run(self) -> None:
        txn = 0
        while not self._stop.is_set():
            try:
                producer = self.producer or self._new_producer()
            except KafkaException:
                time.sleep(0.5)
                continue
            txn += 1
            self._one(producer, txn)
            if self.pause_s:
                time.sleep(self.pause_s)
        close_quietly(self.producer)
        self.producer = None

    def _one(self, producer: Producer, txn: int) -> None:
        rows = [(p, value(self.writer, txn, p, i)) for p in sorted(self._rng.sample(range(self.partitions),
                                                                                       self.per_txn))
                for i in range(self.records)]
        commit = self._rng.random() < self.commit_rate
        self.written[txn] = rows
        self.outcomes[txn] = NOT_COMMITTED
        try:
            producer.begin_transaction()
            for p, v in rows:
                producer.produce(self.topic, key=f"w{self.writer}".encode(), value=v, partition=p)
            if not commit:
                producer.flush(self.op_timeout_s)  # the records reach the log: the abort must hide them
                producer.abort_transaction(self.op_timeout_s)
                self.outcomes[txn] = ABORTED
                return
        except KafkaException as e:
            self._failed(producer, e, "before commit")
            return
        self.outcomes[txn] = UNKNOWN  # from here on, the coordinator may commit it
        deadline = time.monotonic() + 3 * self.op_timeout_s
        while True:
            try:
                producer.commit_transaction(self.op_timeout_s)
                self.outcomes[txn] = COMMITTED
                return
            except KafkaException as e:
                err: KafkaError = e.args[0]
                if err.retriable() and time.monotonic() < deadline:
                    self.errors.append(f"commit t{txn} (retrying): {err}")
                    continue
                self._failed(producer, e, f"commit t{txn}")
                return

    def _failed(self, producer: Producer, e: KafkaException, where: str) -> None:
        """After a failure the transaction is aborted if the client can (its outcome stays what it was: a
        failed commit's is not known), else the producer is replaced (its successor's init ends it)."""
        err: KafkaError = e.args[0]
        self.errors.append(f"{where}: {err}")
        if not err.fatal():
            try:
                producer.abort_transaction(self.op_timeout_s)
                return
            except KafkaException as again:
                self.errors.append(f"abort after {where}: {again.args[0]}")
        close_quietly(producer)
        self.producer = None

    def settle(self) -> None:
        """End whatever this id left open: a new producer's InitProducerId aborts an open transaction and
        finishes a prepared one (its markers are durable before it answers)."""
        producer = self._new_producer()
        close_quietly(producer)
        self.producer = None


class Reader:
    """A read_committed consumer of every partition from the beginning, on its own thread."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, name: str, isolation: str = "read_committed"):
        self.topic = topic
        self.partitions = partitions
        self.name = name
        self.rows: dict[int, list[tuple[int, bytes]]] = defaultdict(list)  # partition -> (offset, value)s
        self.errors: list[str] = []
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{name}",
                                   "enable.auto.commit": False, "isolation.level": isolation,
                                   "socket.connection.setup.timeout.ms": 5_000, "reconnect.backoff.max.ms": 500,
                                   "topic.metadata.refresh.interval.ms": 2_000})
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"reader-{name}", daemon=True)

    def start(self) -> Reader:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for m in self._consumer.consume(200, timeout=0.2):
                    if m.error() is not None:
                        self.errors.append(str(m.error()))
                        continue
                    with self._lock:
                        self.rows[m.partition()].append((m.offset(), m.value()))
        finally:
            self._consumer.close()

    def values(self) -> set[bytes]:
        with self._lock:
            return {v for rows in self.rows.values() for _, v in rows}

    def wait_for(self, wanted: set[bytes], deadline_s: float) -> bool:
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            if wanted <= self.values():
                return True
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def read_once(bootstrap: str, topic: str, partitions: int, done: Callable[[set[bytes]], bool],
              deadline_s: float = 60, isolation: str = "read_committed") -> dict[int, list[tuple[int, bytes]]]:
    """A fresh reader from the beginning, until `done` holds of what it read (or the deadline)."""
    reader = Reader(bootstrap, topic, partitions, f"once-{time.monotonic_ns()}", isolation).start()
    try:
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline and not done(reader.values()):
            time.sleep(0.2)
        time.sleep(0.5)  # anything that should not be there has had a chance to turn up
    finally:
        reader.stop()
    return dict(reader.rows)


def check(rows: dict[int, list[tuple[int, bytes]]], writers: list[TxnWriter], who: str,
          extra: set[bytes] = frozenset()) -> dict[str, int]:  # type: ignore[assignment]
    """What one read_committed reader read, against what the writers know. `extra`: other values it may see
    (sentinels). Returns counts for the report."""
    by_writer = {w.writer: w for w in writers}
    seen: dict[tuple[int, int], set[bytes]] = defaultdict(set)
    counts: Counter[bytes] = Counter()
    for p, recs in rows.items():
        offsets = [o for o, _ in recs]
        assert offsets == sorted(offsets), f"{who}: partition {p} read out of offset order"
        last: dict[int, tuple[int, int]] = {}
        for _, v in recs:
            counts[v] += 1
            if v in extra:
                continue
            w, t, vp, i = parse(v)
            assert vp == p, f"{who}: {v!r} read from partition {p}"
            assert (t, i) > last.get(w, (0, -1)), f"{who}: writer {w}'s {v!r} after {last[w]} in partition {p}"
            last[w] = (t, i)
            seen[(w, t)].add(v)
    twice = [v for v, n in counts.items() if n > 1]
    assert not twice, f"{who}: records read more than once: {twice[:10]}"
    result: Counter[str] = Counter()
    for w in writers:
        for t, outcome in w.outcomes.items():
            expected = {v for _, v in w.written[t]}
            got = seen.pop((w.writer, t), set())
            result[f"{outcome}_seen" if got else f"{outcome}_unseen"] += 1
            if outcome == COMMITTED:
                assert got == expected, (f"{who}: committed transaction w{w.writer} t{t} "
                                         f"{'lost' if not got else 'partly read'}: missing {sorted(expected - got)}")
            elif outcome == UNKNOWN:
                assert got in (set(), expected), f"{who}: w{w.writer} t{t} (commit outcome unknown) read in part"
            else:
                assert not got, f"{who}: {outcome} transaction w{w.writer} t{t} visible: {sorted(got)}"
    stray = {k: v for k, v in seen.items() if k[0] not in by_writer or k[1] not in by_writer[k[0]].outcomes}
    assert not stray, f"{who}: records no writer wrote: {stray}"
    return dict(result)


def committed_values(writers: list[TxnWriter]) -> set[bytes]:
    return {v for w in writers for t, o in w.outcomes.items() if o == COMMITTED for _, v in w.written[t]}
