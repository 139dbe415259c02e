"""Errors and edge cases a client observes, checked on the wire (raw requests where clients hide them).

Every test runs on the embedded stores and on etcd + SeaweedFS (the `broker` fixture). Record batches
are built with aiokafka's DefaultRecordBatchBuilder and read back with its DefaultRecordBatch, both
independent of the broker's own batch code.
"""

from __future__ import annotations

import time

import pytest
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from kafscale.protocol import make, nested, request_class
from kafscale.protocol.errors import ErrorCode
from kafscale.storage.batch import split_batches
from kafscale.storage.legacy import Record, message_set
from tests.integration.conftest import (
    METADATA,
    PRODUCE,
    Cluster,
    KafkaWire,
    build,
    nested_request,
    unique_topic,
    wait_until,
)

Row = tuple[bytes | None, bytes | None, int]  # key, value, timestamp


def batch(rows: list[Row], *, compression: int = 0) -> bytes:
    """One v2 record batch (base offset 0, no producer id) holding rows in order."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=0, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=16 * 1024 * 1024)
    for offset, (key, value, timestamp) in enumerate(rows):
        assert builder.append(offset, timestamp=timestamp, key=key, value=value, headers=[]) is not None
    return bytes(builder.build())


def rows(tag: str, n: int, first_timestamp: int = 1_700_000_000_000, step: int = 1) -> list[Row]:
    return [(f"{tag}-{i}".encode(), f"value {tag} {i}".encode(), first_timestamp + i * step) for i in range(n)]


def read_all(wire: KafkaWire, topic: str, partition: int, start: int = 0) -> list[tuple[int, Row]]:
    """Every record from `start` to the high watermark: (offset, (key, value, timestamp))."""
    out: list[tuple[int, Row]] = []
    offset = start
    while True:
        answer = wire.fetch(topic, partition, offset)
        assert answer.error_code == ErrorCode.none, answer.error_code
        if not answer.records:
            assert offset == answer.high_watermark
            return out
        for pos, header in split_batches(memoryview(answer.records), verify_crc=True):
            for r in DefaultRecordBatch(answer.records[pos:pos + header.size]):
                if r.offset >= offset:
                    out.append((r.offset, (r.key, r.value, r.timestamp)))
            offset = header.last_offset + 1


def topic_error(wire: KafkaWire, topic: str, allow_auto_topic_creation: bool = False) -> ErrorCode:
    answer = wire.metadata([topic], allow_auto_topic_creation=allow_auto_topic_creation).topics
    assert len(answer) == 1 and answer[0].name == topic
    return ErrorCode(answer[0].error_code)


def listed_topics(wire: KafkaWire) -> set[str]:
    return {t.name for t in wire.metadata(None).topics}


# ----------------------------------------------------------------------------- produce errors


def test_produce_to_nonexistent_partition_or_topic(broker: Cluster) -> None:
    topic = unique_topic("no-such-partition")
    missing = unique_topic("no-such-topic")
    with broker.wire() as wire:
        wire.create_topic(topic, 3)
        for partition in (3, 99, -1):
            answer = wire.produce(topic, partition, batch(rows("x", 2)))
            assert answer.error_code == ErrorCode.unknown_topic_or_partition, partition
            assert answer.base_offset == -1
        answer = wire.produce(missing, 0, batch(rows("x", 2)))
        assert answer.error_code == ErrorCode.unknown_topic_or_partition
        # Produce never creates topics (Kafka auto-creates on Metadata only), and stored nothing.
        assert topic_error(wire, missing) == ErrorCode.unknown_topic_or_partition
        assert missing not in listed_topics(wire)
        assert wire.end_offsets(topic, 3) == [0, 0, 0]
    assert broker.object_keys(topic) == []


def test_corrupted_batch_is_refused_and_nothing_is_stored(broker: Cluster) -> None:
    topic = unique_topic("corrupt")
    good = batch(rows("good", 3))
    bad = bytearray(batch(rows("bad", 3)))
    bad[-1] ^= 0xFF  # inside the records, so only the CRC32C (over bytes 21..end) can tell
    with broker.wire() as wire:
        wire.create_topic(topic, 2)
        answer = wire.produce(topic, 0, bytes(bad))
        assert answer.error_code == ErrorCode.corrupt_message
        assert answer.base_offset == -1

        # One request, two partitions: the corrupt one is refused, the other is stored.
        parts = (nested_request(PRODUCE, "PartitionProduceData", index=0, records=bytes(bad)),
                 nested_request(PRODUCE, "PartitionProduceData", index=1, records=good))
        response = wire.call(build(PRODUCE, transactional_id=None, acks=-1, timeout=30_000,
                                   topic_data=(nested_request(PRODUCE, "TopicProduceData", name=topic,
                                                              partition_data=parts),)))
        codes = {p.index: p.error_code for p in response.responses[0].partition_responses}
        assert codes == {0: ErrorCode.corrupt_message, 1: ErrorCode.none}

        assert wire.end_offsets(topic, 2) == [0, 3]
        assert read_all(wire, topic, 0) == []
        assert {s.partition for s in broker.stored_segments(topic)} == {1}
        # The refused batches took no offsets: the next good batch starts at 0.
        assert wire.produce(topic, 0, good).base_offset == 0
        assert [row for _, row in read_all(wire, topic, 0)] == rows("good", 3)


def test_acks_zero_gets_no_response_but_records_become_readable(broker: Cluster) -> None:
    topic = unique_topic("acks0")
    sent = rows("fire-and-forget", 50)
    with broker.wire() as wire:
        wire.create_topic(topic, 1)
        silent = wire.send(wire.produce_request(topic, 0, batch(sent), acks=0))
        # The next response on the connection answers the request after it: none came for acks=0.
        follow_up = wire.send(build(METADATA, topics=None, allow_auto_topic_creation=False,
                                    include_cluster_authorized_operations=False,
                                    include_topic_authorized_operations=False))
        corr, _ = wire.receive()
        assert corr == follow_up
        assert silent in wire.sent  # still unanswered
        wire.sent.pop(silent)

        wait_until(lambda: wire.end_offsets(topic, 1) == [len(sent)], what="acks=0 records committed")
        assert [(offset, row) for offset, row in read_all(wire, topic, 0)] == list(enumerate(sent))


def test_legacy_produce_versions_are_advertised_and_served(broker: Cluster) -> None:
    """Produce v0-v2 are in ApiVersions from 0 (librdkafka <= 2.11 compresses with gzip/snappy/lz4 only if the
    broker's Produce range starts at 0) and served: a legacy message set is stored as a v2 batch, and a v2 batch
    sent with v2 is stored as it is (Kafka checks the magic only from v3 on). tests/integration/test_old_protocol.py
    has the rest of the old protocol."""
    topic = unique_topic("legacy")
    with broker.wire() as wire:
        wire.create_topic(topic, 1)
        versions = wire.call(make(request_class(18, 3), client_software_name="kafscale-it",
                                  client_software_version="1"))
        produce_range = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}[PRODUCE]
        assert produce_range[0] == 0
        cls = request_class(PRODUCE, 2)
        for records, base in ((batch(rows("new", 2)), 0), (message_set(1, 0, [Record(0, 5, b"k", b"old")]), 2)):
            part = make(nested(cls, "PartitionProduceData"), index=0, records=records)
            request = make(cls, acks=-1, timeout=30_000,
                           topic_data=(make(nested(cls, "TopicProduceData"), name=topic, partition_data=(part,)),))
            answer = wire.call(request).responses[0].partition_responses[0]
            assert (answer.error_code, answer.base_offset) == (ErrorCode.none, base)
        assert read_all(wire, topic, 0) == [(i, row) for i, row in enumerate(rows("new", 2))] + [(2, (b"k", b"old", 5))]


# ----------------------------------------------------------------------------- metadata and topics


@pytest.mark.parametrize("name", ["has space", "slash/in/name", "..", "x" * 250, "ünïcödé", "semi;colon"])
@pytest.mark.parametrize("auto_create", [False, True])
def test_metadata_for_illegal_topic_name(broker: Cluster, name: str, auto_create: bool) -> None:
    with broker.wire() as wire:
        assert topic_error(wire, name, allow_auto_topic_creation=auto_create) == ErrorCode.invalid_topic_exception
        assert name not in listed_topics(wire)


def test_metadata_auto_creation_follows_the_request(broker: Cluster) -> None:
    not_created = unique_topic("no-auto-create")
    created = unique_topic("auto-create")
    with broker.wire() as wire:
        for _ in range(2):  # asking again does not create it either
            error = topic_error(wire, not_created, allow_auto_topic_creation=False)
            assert error == ErrorCode.unknown_topic_or_partition
        assert not_created not in listed_topics(wire)
        answer = wire.produce(not_created, 0, batch(rows("x", 1)))
        assert answer.error_code == ErrorCode.unknown_topic_or_partition

        # The broker allows auto-creation (its default), so a request that asks for it gets it.
        assert topic_error(wire, created, allow_auto_topic_creation=True) == ErrorCode.none
        assert created in listed_topics(wire)
        assert topic_error(wire, created, allow_auto_topic_creation=False) == ErrorCode.none


def test_create_topics_twice(broker: Cluster) -> None:
    topic = unique_topic("twice")
    with broker.wire() as wire:
        first = wire.create_topics([(topic, 3, {})]).topics[0]
        assert (first.error_code, first.num_partitions) == (ErrorCode.none, 3)
        second = wire.create_topics([(topic, 5, {})]).topics[0]
        assert second.error_code == ErrorCode.topic_already_exists
        assert second.error_message
        [meta] = wire.metadata([topic]).topics
        assert len(meta.partitions) == 3 and meta.topic_id == first.topic_id


def test_create_topics_twice_through_a_client(broker: Cluster) -> None:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = unique_topic("twice-admin")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 2)])[topic].result(30)
    with pytest.raises(KafkaException) as raised:
        admin.create_topics([NewTopic(topic, 2)])[topic].result(30)
    assert raised.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS


@pytest.mark.parametrize("configs", [
    {"no.such.config": "1"},
    {"min.insync.replicas": "2"},  # a real Kafka config this broker does not implement
    {"retention.ms": "soon"},  # a supported config with a value that does not parse
    {"retention.ms": None},
])
def test_create_topics_with_unsupported_config(broker: Cluster, configs: dict[str, str | None]) -> None:
    topic = unique_topic("bad-config")
    with broker.wire() as wire:
        answer = wire.create_topics([(topic, 1, configs)]).topics[0]
        assert answer.error_code == ErrorCode.invalid_config
        assert answer.error_message
        assert topic_error(wire, topic) == ErrorCode.unknown_topic_or_partition


def test_delete_topics_removes_metadata_and_objects(broker: Cluster) -> None:
    topic = unique_topic("delete-me")
    with broker.wire() as wire:
        wire.create_topic(topic, 2)
        for partition in range(2):
            for flush in range(2):
                answer = wire.produce(topic, partition, batch(rows(f"p{partition}f{flush}", 10)))
                assert answer.error_code == ErrorCode.none
        assert {s.partition for s in broker.stored_segments(topic)} == {0, 1}

        answer = wire.delete_topics([topic]).responses[0]
        assert (answer.name, answer.error_code) == (topic, ErrorCode.none)

        assert topic_error(wire, topic) == ErrorCode.unknown_topic_or_partition
        assert topic not in listed_topics(wire)
        assert wire.fetch(topic, 0, 0).error_code == ErrorCode.unknown_topic_or_partition
        assert wire.list_offset(topic, 0, -1).error_code == ErrorCode.unknown_topic_or_partition
        wait_until(lambda: broker.object_keys(topic) == [], what="the topic's objects deleted")
        assert wire.delete_topics([topic]).responses[0].error_code == ErrorCode.unknown_topic_or_partition

        # A topic created again under the name starts empty: nothing of the old one shows through.
        wire.create_topic(topic, 2)
        assert wire.end_offsets(topic, 2) == [0, 0]
        assert wire.produce(topic, 0, batch(rows("reborn", 2))).base_offset == 0
        assert [row for _, row in read_all(wire, topic, 0)] == rows("reborn", 2)


# ----------------------------------------------------------------------------- reading


def test_fetch_beyond_the_high_watermark(broker: Cluster) -> None:
    topic = unique_topic("beyond-hwm")
    with broker.wire() as wire:
        wire.create_topic(topic, 1)
        assert wire.produce(topic, 0, batch(rows("r", 5))).error_code == ErrorCode.none
        at_end = wire.fetch(topic, 0, 5)
        assert (at_end.error_code, at_end.high_watermark, at_end.records) == (ErrorCode.none, 5, b"")
        for offset in (6, 1_000_000, -1):
            answer = wire.fetch(topic, 0, offset)
            assert answer.error_code == ErrorCode.offset_out_of_range, offset
            assert answer.high_watermark == -1 and not answer.records  # as Kafka: an error carries no offsets


def test_fetch_beyond_the_high_watermark_through_a_client(broker: Cluster) -> None:
    """kafka-python with auto_offset_reset='none' surfaces OFFSET_OUT_OF_RANGE as an exception."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import OffsetOutOfRangeError

    topic = unique_topic("beyond-hwm-client")
    with broker.wire() as wire:
        wire.create_topic(topic, 1)
        assert wire.produce(topic, 0, batch(rows("r", 5))).error_code == ErrorCode.none
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="none", fetch_max_wait_ms=100)
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 7)
        with pytest.raises(OffsetOutOfRangeError):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                consumer.poll(timeout_ms=200)
    finally:
        consumer.close()


T0 = 1_750_000_000_000  # all timestamps of the ListOffsets test are T0 + 1000 * flush + 10 * record
FLUSHES, PER_FLUSH = 4, 5


def _timestamp(flush: int, record: int) -> int:
    return T0 + 1000 * flush + 10 * record


@pytest.fixture
def timed_topic(broker: Cluster) -> str:
    """One partition written by FLUSHES acks=all requests (each waits for its own flush, so each
    lands in its own segment) of PER_FLUSH records with known timestamps."""
    topic = unique_topic("timed")
    with broker.wire() as wire:
        wire.create_topic(topic, 1)
        for flush in range(FLUSHES):
            records = [(b"k%d-%d" % (flush, r), b"v", _timestamp(flush, r)) for r in range(PER_FLUSH)]
            answer = wire.produce(topic, 0, batch(records))
            assert (answer.error_code, answer.base_offset) == (ErrorCode.none, flush * PER_FLUSH)
    assert len(broker.stored_segments(topic)) == FLUSHES
    return topic


def _offset_of(flush: int, record: int) -> int:
    return flush * PER_FLUSH + record


@pytest.mark.parametrize(("target", "expected"), [
    pytest.param(T0 - 1, (0, _timestamp(0, 0)), id="before-all"),
    pytest.param(_timestamp(0, 0), (0, _timestamp(0, 0)), id="first"),
    pytest.param(_timestamp(2, 3), (_offset_of(2, 3), _timestamp(2, 3)), id="exact-middle"),
    pytest.param(_timestamp(2, 1) + 5, (_offset_of(2, 2), _timestamp(2, 2)), id="between-records"),
    pytest.param(_timestamp(1, 4) + 500, (_offset_of(2, 0), _timestamp(2, 0)), id="between-segments"),
    pytest.param(_timestamp(FLUSHES - 1, PER_FLUSH - 1), (FLUSHES * PER_FLUSH - 1,
                                                          _timestamp(FLUSHES - 1, PER_FLUSH - 1)), id="last"),
    pytest.param(_timestamp(FLUSHES - 1, PER_FLUSH - 1) + 1, (-1, -1), id="after-all"),
])
def test_list_offsets_by_timestamp(broker: Cluster, timed_topic: str, target: int,
                                   expected: tuple[int, int]) -> None:
    with broker.wire() as wire:
        answer = wire.list_offset(timed_topic, 0, target)
        assert answer.error_code == ErrorCode.none
        assert (answer.offset, answer.timestamp) == expected


def test_list_offsets_earliest_latest_and_max_timestamp(broker: Cluster, timed_topic: str) -> None:
    with broker.wire() as wire:
        earliest = wire.list_offset(timed_topic, 0, -2)
        latest = wire.list_offset(timed_topic, 0, -1)
        newest = wire.list_offset(timed_topic, 0, -3)  # MAX_TIMESTAMP (ListOffsets v7+)
        assert (earliest.error_code, earliest.offset) == (ErrorCode.none, 0)
        assert (latest.error_code, latest.offset) == (ErrorCode.none, FLUSHES * PER_FLUSH)
        last = _timestamp(FLUSHES - 1, PER_FLUSH - 1)
        assert (newest.error_code, newest.offset, newest.timestamp) == (ErrorCode.none, FLUSHES * PER_FLUSH - 1, last)


def test_list_offsets_through_a_client(broker: Cluster, timed_topic: str) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "kafscale-it-list-offsets",
                         "enable.auto.commit": False})
    try:
        assert consumer.get_watermark_offsets(TopicPartition(timed_topic, 0), timeout=30) == (0, FLUSHES * PER_FLUSH)
        [found] = consumer.offsets_for_times([TopicPartition(timed_topic, 0, _timestamp(2, 1) + 5)], timeout=30)
        assert found.error is None and found.offset == _offset_of(2, 2)
    finally:
        consumer.close()
