"""The Messages page's half of the console's Kafka view: a page of records read from an offset or a timestamp,
and a test message produced. A page is bounded in records and in bytes, and a long key or value is cut, so that
one page of large records cannot hold the controller's event loop (which encodes it) or its memory."""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from kafscale.console.answers import TIMEOUT_S, failed
from kafscale.console.kafka_clients import ConsoleClients
from kafscale.console.view import ConsoleError, Header, Message, MessagePage, Produced

BROWSE_WAIT_S = 5.0  # a page of messages is answered with what arrived by then
MAX_PAGE_BYTES = 4 * 1024 * 1024
MAX_VALUE_BYTES = 64 * 1024
TIMESTAMP_TYPES = {1: "CreateTime", 2: "LogAppendTime"}


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data[:MAX_VALUE_BYTES]).decode()


def _message(m: Any) -> tuple[Message, int]:
    kind, ts = m.timestamp()
    key, value = m.key(), m.value()
    size = len(key or b"") + len(value or b"")
    truncated = len(key or b"") > MAX_VALUE_BYTES or len(value or b"") > MAX_VALUE_BYTES
    headers = [Header(k, _b64(v)) for k, v in (m.headers() or [])]
    return Message(m.partition(), m.offset(), ts, TIMESTAMP_TYPES.get(kind, "None"), _b64(key), _b64(value),
                   headers, truncated), min(size, 2 * MAX_VALUE_BYTES)


def browse(clients: ConsoleClients, topic: str, partition: int, offset: int | None, timestamp: int | None,
           limit: int) -> MessagePage:
    """Blocking: run it in a thread. A consumer of no group: assign() neither joins nor commits."""
    consumer = Consumer(clients.settings(**{
        "group.id": "kafscale-console", "enable.auto.commit": False, "enable.auto.offset.store": False,
        "isolation.level": "read_committed", "fetch.max.bytes": 2 * MAX_PAGE_BYTES,
        "queued.max.messages.kbytes": 2 * MAX_PAGE_BYTES // 1024}))
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), TIMEOUT_S)
        if timestamp is not None:
            found = consumer.offsets_for_times([TopicPartition(topic, partition, timestamp)], TIMEOUT_S)[0]
            start = high if found.offset < 0 else found.offset
        else:
            start = low if offset is None else min(max(offset, low), high)
        messages: list[Message] = []
        size = 0
        if start < high:
            consumer.assign([TopicPartition(topic, partition, start)])
            deadline = time.monotonic() + BROWSE_WAIT_S
            while len(messages) < limit and size < MAX_PAGE_BYTES and time.monotonic() < deadline:
                for m in consumer.consume(min(limit - len(messages), 500), 0.5):
                    error = m.error()
                    if error is not None:
                        # Only this partition's own errors end the page: the consumer's group id (which the
                        # client needs but never uses) may be refused by the ACLs, harmlessly.
                        if m.topic() == topic and m.partition() == partition and \
                                error.code() != KafkaError._PARTITION_EOF:
                            raise failed(f"read {topic}-{partition}", KafkaException(error))
                        continue
                    message, bytes_ = _message(m)
                    messages.append(message)
                    size += bytes_
                    if len(messages) >= limit or size >= MAX_PAGE_BYTES:
                        break
                if messages and messages[-1].offset >= high - 1:
                    break
        return MessagePage(topic, partition, start, messages, high)
    finally:
        consumer.close()


def _wait_delivered(producer: Producer, outcome: list[Any], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not outcome and time.monotonic() < deadline:
        producer.poll(0.1)


async def produce(clients: ConsoleClients, topic: str, partition: int | None, key: bytes | None,
                  value: bytes | None, headers: list[tuple[str, bytes]]) -> Produced:
    producer = clients.producer
    outcome: list[tuple[KafkaError | None, Any]] = []
    kwargs: dict[str, Any] = {"key": key, "value": value, "headers": headers,
                              "on_delivery": lambda err, msg: outcome.append((err, msg))}
    if partition is not None:
        kwargs["partition"] = partition
    try:
        producer.produce(topic, **kwargs)
    except (KafkaException, BufferError) as e:
        raise failed(f"produce to {topic!r}", e) from None
    # The delivery report comes from poll(), which blocks: in a thread, until it has come or the message timed out.
    await asyncio.to_thread(_wait_delivered, producer, outcome, TIMEOUT_S + 5)
    if not outcome:
        raise ConsoleError(504, f"produce to {topic!r}: no answer from the cluster within {TIMEOUT_S + 5:.0f}s")
    err, msg = outcome[0]
    if err is not None:
        raise failed(f"produce to {topic!r}", KafkaException(err))
    return Produced(msg.topic(), msg.partition(), msg.offset())
