"""Producing and consuming with real Kafka clients, to compare Spark's view of a topic with a consumer's."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


@dataclass(frozen=True, order=True)
class Rec:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int  # ms
    timestamp_type: int  # 0 CreateTime, 1 LogAppendTime


def create_topic(bootstrap: str, topic: str, partitions: int, configs: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, partitions, config=configs or {})], operation_timeout=30)
    futures[topic].result(60)


def random_messages(n: int, *, seed: int, start_ms: int, step_ms: int = 1) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        key = None if rng.random() < 0.2 else rng.randbytes(rng.choice([0, 5, 12, 13, 30]))
        value = None if rng.random() < 0.05 else rng.randbytes(rng.choice([0, 1, 50, 100, 400]))
        headers = [(f"h{j}", None if rng.random() < 0.2 else rng.randbytes(rng.randint(0, 16)))
                   for j in range(rng.choice([0, 0, 1, 2]))]
        out.append({"key": key, "value": value, "headers": headers, "timestamp": start_ms + i * step_ms})
    return out


def produce(bootstrap: str, topic: str, messages: Iterable[dict[str, Any]], *, codec: str = "none",
            partitions: int = 2, idempotent: bool = False) -> int:
    """idempotent=True keeps each partition in the order given even through retries (a new topic's first batches
    can be refused until its leader is up; a plain producer's retry then lands behind later batches)."""
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 5,
                         "acks": "all", "batch.num.messages": 40, "enable.idempotence": idempotent})
    failures: list[Any] = []
    count = 0
    for i, m in enumerate(messages):
        producer.produce(topic, value=m["value"], key=m["key"], headers=m["headers"] or None,
                         timestamp=m["timestamp"], partition=m.get("partition", i % partitions),
                         on_delivery=lambda err, _msg: failures.append(err) if err else None)
        producer.poll(0)
        count += 1
    assert producer.flush(60) == 0
    assert not failures, failures[:3]
    return count


def produce_xerial_snappy(bootstrap: str, topic: str, messages: Iterable[dict[str, Any]], partitions: int = 2) -> None:
    """kafka-python frames snappy the way the Java client does (xerial blocks), unlike librdkafka."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, compression_type="snappy", acks="all", linger_ms=5,
                             enable_idempotence=False)
    # kafka-python refuses null header values and records with neither key nor value.
    futures = [producer.send(topic, value=m["value"] if m["value"] is not None or m["key"] else b"", key=m["key"],
                             headers=[(k, v or b"") for k, v in m["headers"]] or None,
                             timestamp_ms=m["timestamp"], partition=i % partitions)
               for i, m in enumerate(messages)]
    producer.flush(60)
    for f in futures:
        f.get(30)
    producer.close()


def consume_all(bootstrap: str, topic: str, partitions: int, timeout: float = 60.0) -> list[Rec]:
    """Every record up to the high watermark of each partition, as a consumer sees it."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{os.getpid()}-{time.time_ns()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(partitions)}
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[Rec] = []
        seen = {p: 0 for p in range(partitions)}
        deadline = time.monotonic() + timeout
        while any(seen[p] < ends[p] for p in ends):
            assert time.monotonic() < deadline, f"consumed {seen} of {ends}"
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            ts_type, ts = msg.timestamp()
            got.append(Rec(msg.partition(), msg.offset(), msg.key(), msg.value(), tuple(msg.headers() or ()), ts,
                           0 if ts_type == 1 else 1))
            seen[msg.partition()] = msg.offset() + 1
        return sorted(got)
    finally:
        consumer.close()


def spark_records(df: Any) -> list[Rec]:
    """The rows of a kafscale DataFrame as Rec, timestamps in exact milliseconds (via Arrow, not datetime)."""
    table = df.toArrow()
    ts = table.column("timestamp").cast("int64").to_pylist()
    out = []
    for row, micros in zip(table.to_pylist(), ts, strict=True):
        headers = tuple((h["key"], h["value"]) for h in row["headers"] or [])
        out.append(Rec(row["partition"], row["offset"], row["key"], row["value"], headers, micros // 1000,
                       row["timestampType"]))
    return sorted(out)
