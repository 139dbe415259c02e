"""The old protocol over real TCP: Produce v0-v2 with magic 0/1 message sets, Fetch v0-v3, ListOffsets v0 and the
group APIs' old versions, by raw requests (KafkaWire) and by a real old client (kafka-python speaking the versions
of Kafka 0.9 and 0.10.0). Old and current clients share the topics: each reads what the other wrote.

The helpers here are the differential tests' too (tests/differential/test_old_protocol.py).
"""

from __future__ import annotations

import datetime
import random
import sys
import time
from typing import Any

import pytest
from aiokafka.record.memory_records import MemoryRecords

from kafscale.protocol import make, request_class
from kafscale.protocol.errors import ErrorCode
from kafscale.storage.legacy import Record, inner_messages, message_set, read_message, split_entries
from tests.integration.conftest import Cluster, KafkaWire, unique_topic

Message = tuple[int, int | None, bytes | None, bytes | None]  # offset, timestamp (None: magic 0), key, value
T = 1_700_000_000_000


def old_request(api_key: int, version: int, /, **fields: Any) -> Any:
    return make(request_class(api_key, version), **fields)


def old_part(api_key: int, version: int, entity: str, /, **fields: Any) -> Any:
    return make(getattr(sys.modules[request_class(api_key, version).__module__], entity), **fields)


def produce_old(wire: KafkaWire, version: int, topic: str, partition: int, records: bytes, acks: int = -1) -> Any:
    """The partition's answer to a one-partition Produce of this (old) version."""
    data = old_part(0, version, "TopicProduceData", name=topic, partition_data=(
        old_part(0, version, "PartitionProduceData", index=partition, records=records),))
    answer = wire.call(old_request(0, version, transactional_id=None, acks=acks,
                                   timeout=datetime.timedelta(seconds=30), topic_data=(data,)))
    return answer.responses[0].partition_responses[0]


def fetch_old(wire: KafkaWire, version: int, wanted: list[tuple[str, int, int, int]], max_bytes: int = 1 << 24,
              max_wait_ms: int = 0, min_bytes: int = 0) -> list[Any]:
    """Every partition's answer, in request order; wanted: (topic, partition, offset, partition max bytes)."""
    topics: dict[str, list[Any]] = {}
    for topic, partition, offset, limit in wanted:
        topics.setdefault(topic, []).append(old_part(1, version, "FetchPartition", partition=partition,
                                                     fetch_offset=offset, partition_max_bytes=limit))
    answer = wire.call(old_request(1, version, replica_id=-1, max_wait=datetime.timedelta(milliseconds=max_wait_ms),
                                   min_bytes=min_bytes, max_bytes=max_bytes, topics=tuple(
                                       old_part(1, version, "FetchTopic", topic=t, partitions=tuple(ps))
                                       for t, ps in topics.items())))
    return [p for t in answer.responses for p in t.partitions]


def list_offsets_v0(wire: KafkaWire, topic: str, partition: int, timestamp: int,
                    max_num_offsets: int) -> tuple[int, tuple[int, ...]]:
    wanted = old_part(2, 0, "ListOffsetsPartition", partition_index=partition, timestamp=timestamp,
                      max_num_offsets=max_num_offsets)
    answer = wire.call(old_request(2, 0, replica_id=-1, topics=(
        old_part(2, 0, "ListOffsetsTopic", name=topic, partitions=(wanted,)),)))
    p = answer.topics[0].partitions[0]
    return int(p.error_code), tuple(p.old_style_offsets)


def legacy_messages(data: bytes) -> list[Message]:
    """The whole messages of a legacy set, a partial one at the end left out (as every old consumer does). By
    aiokafka's reader, or ours when the set holds lz4 at magic 0 (aiokafka and kafka-python need xxhash for it)."""
    entries = [(at, size, data[at + 16], data[at + 17] & 7) for at, size, _ in split_entries(data)]
    out: list[Message] = []
    if any(magic == 0 and codec == 3 for *_, magic, codec in entries):
        for at, size, *_ in entries:
            message = read_message(data, at, size)
            out += [(m.offset, None, m.key, m.value) for m in (inner_messages(message) if message.codec else [message])]
        return out
    records = MemoryRecords(data)
    while (batch := records.next_batch()) is not None:
        out += [(r.offset, r.timestamp, r.key, r.value) for r in batch]
    return out


def read_all_old(wire: KafkaWire, version: int, topic: str, partition: int, limit: int = 1 << 20) -> list[Message]:
    """A partition from 0 to its high watermark, as an old consumer reads it: fetch, skip what is below the
    offset asked for (a compressed wrapper comes whole), go on after the last message."""
    out: list[Message] = []
    offset = 0
    while True:
        (answer,) = fetch_old(wire, version, [(topic, partition, offset, limit)])
        assert answer.error_code == ErrorCode.none, answer.error_code
        got = [m for m in legacy_messages(bytes(answer.records or b"")) if m[0] >= offset]
        if not got:
            assert offset == answer.high_watermark, (offset, answer.high_watermark)
            return out
        out += got
        offset = got[-1][0] + 1


def legacy(magic: int, tag: str, n: int, codec: int = 0) -> tuple[bytes, list[tuple[int | None, bytes, bytes]]]:
    """A message set of n messages and what a reader should get of them: (timestamp, key, value)."""
    rows = [(T + i if magic else None, f"{tag}-{i}".encode(), f"value {tag} {i}".encode()) for i in range(n)]
    return message_set(magic, codec, [Record(i, -1 if ts is None else ts, k, v)
                                      for i, (ts, k, v) in enumerate(rows)]), rows


# ------------------------------------------------------------------------------------------------ tests


def test_old_producers_and_current_consumers_share_a_partition(broker: Cluster) -> None:
    """Sets of every magic and codec, produced with v0-v2, then read back by every old Fetch version (offsets
    exact, magic 0 without timestamps) and by a current client (confluent-kafka, Fetch v11+)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    topic = unique_topic("old-producers")
    expected: list[tuple[int, int | None, bytes, bytes]] = []
    with broker.wire() as wire:
        wire.create_topic(topic, 1)
        sets = [(0, 0, 0), (1, 0, 1), (1, 0, 2), (1, 0, 3), (2, 1, 0), (2, 1, 1), (2, 1, 2), (2, 1, 3)]
        for i, (version, magic, codec) in enumerate(sets):
            records, rows = legacy(magic, f"s{i}", 3, codec)
            answer = produce_old(wire, version, topic, 0, records)
            assert (answer.error_code, answer.base_offset) == (ErrorCode.none, len(expected))
            expected += [(len(expected) + j, ts, k, v) for j, (ts, k, v) in enumerate(rows)]
        for version in (0, 1, 2, 3):
            got = read_all_old(wire, version, topic, 0)
            # Magic 0 messages are stored without a timestamp (-1), which reads as none at magic 1 too.
            assert got == [(o, ts if version >= 2 else None, k, v) for o, ts, k, v in expected], version
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": topic, "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        seen: list[tuple[int, int, bytes | None, bytes | None]] = []
        deadline = time.monotonic() + 30
        while len(seen) < len(expected) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                seen.append((msg.offset(), msg.timestamp()[1], msg.key(), msg.value()))
    finally:
        consumer.close()
    assert seen == [(o, -1 if ts is None else ts, k, v) for o, ts, k, v in expected]


def test_old_consumers_read_what_current_producers_wrote(broker: Cluster) -> None:
    """confluent-kafka's batches (with headers, lz4) read with Fetch v0-v3: headers dropped, offsets exact, the
    fetch offset honoured inside a batch, timestamps from magic 1 on."""
    from confluent_kafka import Producer

    topic = unique_topic("old-consumers")
    with broker.wire() as wire:
        wire.create_topic(topic, 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": "lz4", "linger.ms": 50})
    for i in range(40):
        producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i, timestamp=T + i, headers=[("h", b"x" * 20)])
    assert producer.flush(30) == 0
    with broker.wire() as wire:
        for version in (0, 1, 2, 3):
            got = read_all_old(wire, version, topic, 0)
            assert got == [(i, T + i if version >= 2 else None, b"k%d" % i, b"v%d" % i) for i in range(40)]
            (answer,) = fetch_old(wire, version, [(topic, 0, 17, 1 << 20)])
            first = legacy_messages(bytes(answer.records))[0][0]
            assert first <= 17  # a compressed batch comes whole; the consumer skips to its offset


def test_a_damaged_message_set_is_answered_and_the_connection_stays(broker_embedded: Cluster) -> None:
    topic = unique_topic("old-damage")
    rng = random.Random(32)
    good, _ = legacy(1, "ok", 3, codec=1)
    with broker_embedded.wire() as wire:
        wire.create_topic(topic, 1)
        for _ in range(60):
            damaged = bytearray(good)
            for _ in range(rng.randint(1, 4)):
                damaged[rng.randrange(len(damaged))] = rng.randrange(256)
            answer = produce_old(wire, rng.choice([0, 1, 2]), topic, 0, bytes(damaged))
            assert answer.error_code in (ErrorCode.none, ErrorCode.corrupt_message, ErrorCode.invalid_record,
                                         ErrorCode.invalid_timestamp), answer.error_code
        for garbage in (b"\xff" * 40, bytes(rng.randrange(256) for _ in range(500)), good[:30] + b"\x00" * 5):
            assert produce_old(wire, 0, topic, 0, garbage).error_code in (
                ErrorCode.none, ErrorCode.corrupt_message, ErrorCode.invalid_record)
        assert produce_old(wire, 2, topic, 0, good).error_code == ErrorCode.none  # the same connection
        assert wire.metadata([topic]).topics[0].error_code == ErrorCode.none


def test_list_offsets_v0_on_a_written_partition(broker_embedded: Cluster) -> None:
    topic = unique_topic("old-offsets")
    with broker_embedded.wire() as wire:
        wire.create_topic(topic, 2)
        produce_old(wire, 0, topic, 0, legacy(0, "a", 4)[0])
        future = int(time.time() * 1000) + 3_600_000
        assert [list_offsets_v0(wire, topic, 0, ts, n) for ts, n in ((-1, 1), (-1, 5), (-2, 5), (future, 5))] == [
            (0, (4,)), (0, (4, 0)), (0, (0,)), (0, (4, 0))]
        assert list_offsets_v0(wire, topic, 1, -1, 5) == (0, (0,))
        assert list_offsets_v0(wire, unique_topic("missing"), 0, -1, 1)[0] == ErrorCode.unknown_topic_or_partition


@pytest.mark.parametrize(("api_version", "codecs"), [((0, 9), [None, "gzip", "snappy"]),
                                                     ((0, 10, 0), [None, "gzip", "snappy", "lz4"])])
def test_kafka_python_speaking_old_versions(broker_embedded: Cluster, api_version: tuple[int, ...],
                                            codecs: list[str | None]) -> None:
    """A real old client: kafka-python told it talks to Kafka 0.9 (Produce v1, Fetch v1, magic 0, ListOffsets v0,
    JoinGroup v0) or 0.10.0 (Produce v2, Fetch v2, magic 1); lz4 at magic 0 needs xxhash, which it lacks here.
    A group consumer commits, and its successor in the group goes on from there."""
    from kafka import KafkaConsumer, KafkaProducer

    topic = unique_topic("kafka-python-old")
    with broker_embedded.wire() as wire:
        wire.create_topic(topic, 2)
    sent: list[tuple[bytes, bytes]] = []
    for codec in codecs:
        producer = KafkaProducer(bootstrap_servers=broker_embedded.bootstrap, api_version=api_version,
                                 compression_type=codec, linger_ms=10)
        futures = [producer.send(topic, key=b"%s-%d" % (str(codec).encode(), i), value=b"v%d" % i, partition=i % 2)
                   for i in range(20)]
        producer.flush(30)
        assert all(f.get(30).offset >= 0 for f in futures)
        producer.close()
        sent += [(b"%s-%d" % (str(codec).encode(), i), b"v%d" % i) for i in range(20)]

    def consume(expected: int) -> list[Any]:
        consumer = KafkaConsumer(topic, bootstrap_servers=broker_embedded.bootstrap, api_version=api_version,
                                 group_id=topic, auto_offset_reset="earliest", enable_auto_commit=False,
                                 consumer_timeout_ms=15_000)
        got: list[Any] = []
        try:
            for message in consumer:
                got.append(message)
                if len(got) == expected:
                    break
            consumer.commit()
        finally:
            consumer.close()
        return got

    got = consume(len(sent) // 2)
    deadline = time.monotonic() + 60
    while len(got) < len(sent) and time.monotonic() < deadline:  # each consumer goes on from the last commit
        got += consume(len(sent) - len(got))
    assert sorted((m.key, m.value) for m in got) == sorted(sent)  # each record once: the commit held
    by_partition = sorted((m.partition, m.offset) for m in got)
    assert by_partition == sorted((p, o) for p in (0, 1) for o in range(len(sent) // 2))
    if api_version >= (0, 10):
        assert all(m.timestamp > 0 for m in got)
    else:
        assert all(m.timestamp in (None, -1) for m in got)
