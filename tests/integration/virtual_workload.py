"""The workload of issue 24, shared by the native virtual partitions and the proxy: keyed idempotent producers,
six members of one group (three confluent-kafka, three kafka-python) on a topic of 100 virtual partitions."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from kafka import KafkaConsumer
from kafka.coordinator.assignors.range import RangePartitionAssignor

from kafscale.config import BrokerConfig
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.local_store import LocalDirStore
from kafscale.testing.inprocess import InProcessBroker

PARTITIONS = 100


def embedded_broker(root: Path) -> InProcessBroker:
    """A broker on embedded stores under `root`: another started on the same root is the same broker restarted."""
    return InProcessBroker(BrokerConfig(shards_per_node=1, flush_interval_ms=20),
                           meta=lambda: EmbeddedStore(root / "meta.db"),
                           objects=lambda: LocalDirStore(root / "objects")).start()


class Member:
    """One group member on a thread of its own (confluent-kafka or kafka-python): records it consumed, commits
    after each poll. `session_ms` shortens the session timeout for brokers whose joins wait on it."""

    def __init__(self, kind: str, bootstrap: str, topic: str, group: str, session_ms: int | None = None) -> None:
        self.kind, self.records = kind, []  # (partition, offset, key, value)
        self._assigned = 0
        self.stop = threading.Event()
        if kind == "confluent":
            extra = {"session.timeout.ms": session_ms} if session_ms else {}
            self.client: Any = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                         "partition.assignment.strategy": "range", **extra})
            self.client.subscribe([topic])
        else:
            extra = {"session_timeout_ms": session_ms, "heartbeat_interval_ms": session_ms // 3} if session_ms else {}
            self.client = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                                        auto_offset_reset="earliest", enable_auto_commit=False,
                                        partition_assignment_strategy=[RangePartitionAssignor], **extra)
            # kafka-python 3.0.12: a leader that joins before it has the topic's metadata can stop heartbeating
            # for good after its second join (docs/groups.md, "Client notes"); the workaround given there
            assert self.client.partitions_for_topic(topic) == set(range(PARTITIONS))
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def assigned(self) -> int:
        return self._assigned

    def _run(self) -> None:  # the client is used from this thread only: neither client is thread-safe
        while not self.stop.is_set():
            self._assigned = len(self.client.assignment())
            if self.kind == "confluent":
                got = [(m.partition(), m.offset(), m.key(), m.value()) for m in self.client.consume(200, 0.1)
                       if m.error() is None]
            else:
                got = [(r.partition, r.offset, r.key, r.value)
                       for rs in self.client.poll(timeout_ms=100).values() for r in rs]
            if got:
                self.records += got
                self.client.commit() if self.kind == "kafka-python" else self.client.commit(asynchronous=False)
        self.client.close()


def consume_as_a_group(bootstrap: str, topic: str, group: str, records: int,
                       session_ms: int | None = None) -> tuple[dict[bytes, tuple[int, int]], list[Member]]:
    """Six members join, `records` keyed records are produced, the members consume them all and stop:
    what was sent (value -> (partition, offset)) and the members."""
    members = [Member(kind, bootstrap, topic, group, session_ms) for kind in ["confluent", "kafka-python"] * 3]
    try:
        deadline = time.monotonic() + 90
        while sum(m.assigned() for m in members) != PARTITIONS or not all(m.assigned() for m in members):
            assert time.monotonic() < deadline, [m.assigned() for m in members]
            time.sleep(0.2)
        sent = produce_keyed(bootstrap, topic, 0, records)
        deadline = time.monotonic() + 60
        while sum(len(m.records) for m in members) < len(sent) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        for m in members:
            m.stop.set()
        for m in members:
            m.thread.join(20)
    return sent, members


def check_consumed(sent: dict[bytes, tuple[int, int]], members: list[Member]) -> None:
    """Every record once, by the one member owning its partition, at the partition and offset its producer was
    told, in per-key order."""
    consumed = [(p, o, k, v) for m in members for p, o, k, v in m.records]
    assert sorted(v for *_, v in consumed) == sorted(sent), "every record once"
    for m in members:
        mine = {p for p, *_ in m.records}
        assert not any(mine & {p for p, *_ in other.records} for other in members if other is not m)
    for p, o, _k, v in consumed:
        assert sent[v] == (p, o), "consumed at the partition and offset its producer was told"
    by_key = defaultdict(list)
    for _p, _o, k, v in sorted(consumed, key=lambda r: (r[0], r[1])):
        by_key[k].append(int(v.split(b":")[1]))
    assert all(seqs == sorted(seqs) for seqs in by_key.values()), "per-key order"


def produce_keyed(bootstrap: str, topic: str, start: int, n: int) -> dict[bytes, tuple[int, int]]:
    """value -> (partition, offset), values "key:seq" over 300 keys."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    sent: dict[bytes, tuple[int, int]] = {}

    def delivered(err: Any, msg: Any) -> None:
        assert err is None, err
        sent[msg.value()] = (msg.partition(), msg.offset())

    for i in range(start, start + n):
        producer.produce(topic, key=f"k{i % 300}".encode(), value=f"k{i % 300}:{i}".encode(), on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(30) == 0 and len(sent) == n
    return sent


def lag(bootstrap: str, topic: str, group: str) -> dict[int, int]:
    """Per partition: its end offset less the group's committed offset."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=20)
        return {tp.partition: consumer.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=10)[1]
                - max(tp.offset, 0) for tp in committed}
    finally:
        consumer.close()


def resumed(bootstrap: str, topic: str, group: str, expected: int) -> dict[bytes, tuple[int, int]]:
    """What a consumer of every partition reads from the group's committed offsets: value -> (partition, offset).
    Reads until `expected` records came, and half a second more for any that should not have."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=20)
        consumer.assign(committed)
        got: dict[bytes, tuple[int, int]] = {}
        deadline, quiet_until = time.monotonic() + 60, None
        while time.monotonic() < deadline and (quiet_until is None or time.monotonic() < quiet_until):
            for m in consumer.consume(500, 0.2):
                if m.error() is None:
                    got[m.value()] = (m.partition(), m.offset())
            if len(got) >= expected and quiet_until is None:
                quiet_until = time.monotonic() + 0.5
        return got
    finally:
        consumer.close()
