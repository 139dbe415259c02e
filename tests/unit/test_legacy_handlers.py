"""The old protocol versions through their handlers (Produce v0-v2, Fetch v0-v3, ListOffsets v0, OffsetCommit and
OffsetFetch v0-v1) against the fake broker: what is stored, what is answered, and the shapes of old responses."""

from __future__ import annotations

import struct
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from aiokafka.record.memory_records import MemoryRecords

from kafscale.acceptor import dispatch
from kafscale.acceptor.handlers import fetch, list_offsets, offset_commit, offset_fetch, produce
from kafscale.protocol.codec import decode_response
from kafscale.protocol.errors import ErrorCode
from kafscale.storage.batch import read_header
from kafscale.storage.legacy import Record, message_set
from tests.unit.fake_broker import FakeBroker, context, fake_broker, record_batch
from tests.unit.test_handlers import part, produce_request, request

T = 1_700_000_000_000


def legacy(magic: int, *values: bytes, codec: int = 0, timestamp: int = T) -> bytes:
    return message_set(magic, codec, [Record(i, timestamp if magic else -1, b"k", v) for i, v in enumerate(values)])


async def produce_old(broker: FakeBroker, version: int, records: bytes, topic: str = "t") -> Any:
    answer = await produce.handle(broker, context(0, version), produce_request(version, -1, topic, records))
    _, decoded = decode_response(0, version, answer.frame[4:])
    return decoded


def messages(data: bytes) -> list[tuple[int, int | None, bytes | None]]:
    out = []
    records = MemoryRecords(data)
    while (batch := records.next_batch()) is not None:
        out += [(r.offset, r.timestamp, r.value) for r in batch]
    return out


async def fetch_old(broker: FakeBroker, version: int, wanted: list[tuple[str, int, int, int]],
                    max_bytes: int = 1 << 20) -> list[Any]:
    topics = {}
    for topic, partition, offset, limit in wanted:
        topics.setdefault(topic, []).append(part(1, version, "FetchPartition", partition=partition,
                                                 fetch_offset=offset, partition_max_bytes=limit))
    answer = await fetch.handle(broker, context(1, version), request(
        1, version, replica_id=-1, max_wait=0, min_bytes=0, max_bytes=max_bytes, topics=tuple(
            part(1, version, "FetchTopic", topic=t, partitions=tuple(ps)) for t, ps in topics.items())))
    return [p for t in answer.responses for p in t.partitions]


async def test_old_versions_are_advertised_from_zero(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        advertised = dispatch.build_router(broker).supported()
    for api_key in (0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14):  # what sarama and kafka-go 0.2 send at their oldest
        assert advertised[api_key][0] == 0, api_key


@pytest.mark.parametrize(("version", "magic", "codec"), [(0, 0, 0), (1, 0, 1), (2, 1, 0), (2, 1, 2), (1, 0, 3)])
async def test_produce_v0_v2_stores_one_v2_batch_per_partition(tmp_path: Path, version: int, magic: int,
                                                               codec: int) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 1, [0])
        for expected_base in (0, 3):
            answer = (await produce_old(broker, version, legacy(magic, b"a", b"b", b"c", codec=codec))).responses[0]
            partition = answer.partition_responses[0]
            assert (partition.error_code, partition.base_offset) == (ErrorCode.none, expected_base)
            if version >= 2:
                assert partition.log_append_time is None  # -1: CreateTime
        stored = broker.logs[("t", 0)].batches
        assert [(first, last) for first, last, _ in stored] == [(0, 2), (3, 5)]
        header = read_header(stored[0][2])
        assert (header.magic, header.compression, header.first_timestamp) == (2, codec, T if magic else -1)


async def test_produce_v0_v2_answers_kafkas_codes_and_stores_nothing_then(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 1, [0])
        corrupt = bytearray(legacy(1, b"a"))
        corrupt[-1] ^= 1
        cases = [("t", bytes(corrupt), ErrorCode.corrupt_message, -1),
                 ("t", legacy(0, b"a") + legacy(1, b"b"), ErrorCode.invalid_record, -1),
                 ("t", b"", ErrorCode.none, -1),  # nothing to append: success, base offset -1 (as Kafka)
                 ("missing", bytes(corrupt), ErrorCode.unknown_topic_or_partition, -1),  # the topic comes first
                 ("missing", legacy(0, b"a"), ErrorCode.unknown_topic_or_partition, -1)]
        for topic, records, code, base in cases:
            partition = (await produce_old(broker, 2, records, topic)).responses[0].partition_responses[0]
            assert (partition.error_code, partition.base_offset) == (code, base), (topic, records)
        assert ("t", 0) not in broker.logs  # nothing reached the partition


async def test_produce_v2_takes_v2_batches_too(tmp_path: Path) -> None:
    """Kafka checks the records' magic only from Produce v3 on."""
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 1, [0])
        partition = (await produce_old(broker, 2, bytes(record_batch(b"x", b"y")))).responses[0].partition_responses[0]
        assert (partition.error_code, partition.base_offset) == (ErrorCode.none, 0)
        assert broker.logs[("t", 0)].end == 2


async def test_produce_v2_on_a_log_append_time_topic_refuses_a_producer_claiming_it(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 1, [0], configs={"message.timestamp.type": "LogAppendTime"})
        claims = bytearray(legacy(1, b"a"))
        claims[17] |= 0x08  # attributes: LogAppendTime
        struct.pack_into(">I", claims, 12, zlib.crc32(claims[16:]))
        partition = (await produce_old(broker, 2, bytes(claims))).responses[0].partition_responses[0]
        assert partition.error_code == ErrorCode.invalid_timestamp
        assert (await produce_old(broker, 2, legacy(1, b"b"))).responses[0].partition_responses[0].error_code == 0


@pytest.mark.parametrize(("version", "magic"), [(0, 0), (1, 0), (2, 1), (3, 1)])
async def test_fetch_v0_v3_answers_messages_of_the_versions_magic(tmp_path: Path, version: int, magic: int) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 1, [0])
        await produce_old(broker, 2, legacy(1, b"a", b"b"))
        await broker.produce("t", 0, record_batch(b"c"), -1, 1000)  # a current producer's batch (timestamp 1)
        (answer,) = await fetch_old(broker, version, [("t", 0, 1, 1 << 20)])
        assert (answer.error_code, answer.high_watermark) == (ErrorCode.none, 3)
        # Records below the fetch offset of an uncompressed batch are left out, as Kafka leaves them.
        stamps = [T, 1] if magic else [None, None]
        assert messages(answer.records) == [(1, stamps[0], b"b"), (2, stamps[1], b"c")]
        assert answer.records[16] == magic


async def test_fetch_v0_v2_never_exceed_the_partition_limit_and_v3_lets_the_first_partition(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 2, [0])
        for partition in (0, 1):
            await broker.produce("t", partition, record_batch(b"x" * 100), -1, 1000)
        size = len(broker.logs[("t", 0)].batches[0][2])
        # v0-v2: a first batch beyond partition_max_bytes gives nothing (the consumer asks for more bytes).
        assert [p.records for p in await fetch_old(broker, 2, [("t", 0, 0, size - 1)])] == [b""]
        assert messages((await fetch_old(broker, 2, [("t", 0, 0, size)]))[0].records)[0][0] == 0
        # v3: only the first partition with data may exceed the limits; the next one waits for another fetch.
        answers = await fetch_old(broker, 3, [("t", 0, 0, 10), ("t", 1, 0, 10)], max_bytes=size)
        assert [len(messages(p.records)) for p in answers] == [1, 0]
        answers = await fetch_old(broker, 3, [("t", 0, 0, 1 << 20), ("t", 1, 0, 1 << 20)], max_bytes=size + 10)
        assert [len(messages(p.records)) for p in answers] == [1, 0]


async def test_fetch_v0_v3_errors_and_zstd_topics(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 1, [0])
        await broker.topics.create("z", 1, [0], configs={"compression.type": "zstd"})
        answers = await fetch_old(broker, 1, [("t", 0, 5, 1000), ("missing", 0, 0, 1000), ("z", 0, 0, 1000)])
        assert [(p.error_code, p.high_watermark) for p in answers] == [
            (ErrorCode.offset_out_of_range, -1), (ErrorCode.unknown_topic_or_partition, -1),
            (ErrorCode.unsupported_compression_type, -1)]


async def test_list_offsets_v0_answers_the_old_offsets_array(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 2, [0])
        await produce_old(broker, 0, legacy(0, b"a", b"b", b"c"))
        await broker.delete_records("t", 0, 1)

        async def offsets(partition: int, timestamp: int, max_num: int,
                          topic: str = "t") -> tuple[int, tuple[int, ...]]:
            answer = await list_offsets.handle(broker, context(2, 0), request(2, 0, replica_id=-1, topics=(
                part(2, 0, "ListOffsetsTopic", name=topic, partitions=(part(
                    2, 0, "ListOffsetsPartition", partition_index=partition, timestamp=timestamp,
                    max_num_offsets=max_num),)),)))
            p = answer.topics[0].partitions[0]
            return p.error_code, tuple(p.old_style_offsets)

        future = int(time.time() * 1000) + 60_000
        assert await offsets(0, -1, 1) == (ErrorCode.none, (3,))
        assert await offsets(0, -1, 10) == (ErrorCode.none, (3, 1))  # newest first, down to the log start
        assert await offsets(0, -2, 10) == (ErrorCode.none, (1,))
        assert await offsets(0, future, 10) == (ErrorCode.none, (3, 1))
        assert await offsets(0, 0, 10) == (ErrorCode.none, ())  # before anything was written
        assert await offsets(0, -1, 0) == (ErrorCode.none, ())
        assert await offsets(1, -1, 10) == (ErrorCode.none, (0,))  # an empty partition: its start only
        assert await offsets(1, future, 10) == (ErrorCode.none, (0,))
        assert await offsets(0, -3, 1) == (ErrorCode.unsupported_version, ())  # max timestamp needs v7
        assert await offsets(0, -1, -1) == (ErrorCode.invalid_request, ())
        assert await offsets(0, -1, 1, topic="missing") == (ErrorCode.unknown_topic_or_partition, ())


async def test_offset_commit_v0_v1_and_offset_fetch_v0_share_the_one_offset_store(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 2, [0])

        async def commit(version: int, partition: int, offset: int, **group: Any) -> ErrorCode:
            answer = await offset_commit.handle(broker, context(8, version), request(8, version, group_id="g", topics=(
                part(8, version, "OffsetCommitRequestTopic", name="t", partitions=(
                    part(8, version, "OffsetCommitRequestPartition", partition_index=partition,
                         committed_offset=offset, committed_metadata=f"v{version}", commit_timestamp=-1),)),),
                **group))
            return answer.topics[0].partitions[0].error_code

        async def fetched(version: int) -> list[tuple[int, int, str, ErrorCode]]:
            answer = await offset_fetch.handle(broker, context(9, version), request(9, version, group_id="g", topics=(
                part(9, version, "OffsetFetchRequestTopic", name="t", partition_indexes=(0, 1)),)))
            return [(p.partition_index, p.committed_offset, p.metadata, p.error_code)
                    for p in answer.topics[0].partitions]

        assert await commit(0, 0, 7) == ErrorCode.none
        assert await commit(1, 1, 9, generation_id_or_member_epoch=-1, member_id="") == ErrorCode.none
        assert await commit(1, 1, 9, generation_id_or_member_epoch=3, member_id="m") == ErrorCode.unknown_member_id
        expected = [(0, 7, "v0", ErrorCode.none), (1, 9, "v1", ErrorCode.none)]
        assert await fetched(0) == await fetched(1) == expected
