"""The old protocol against Apache Kafka 3.9.2 (4.0 removed it): the same Produce v0-v2, Fetch v0-v3, ListOffsets
v0 and group v0/v1 requests to the reference and to kafscale, the answers compared: error codes, offsets, and the
messages (byte for byte where the stored batch is the same on both, decoded where compression makes bytes differ).
Each difference that remains is listed in docs/compatibility.md ("Old protocol versions") and asserted as such.
"""

from __future__ import annotations

import datetime
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kafscale.protocol.errors import ErrorCode
from kafscale.storage.legacy import Record, message_set
from kafscale.testing.kafka_reference import ReferenceKafka
from tests.integration.conftest import Cluster, KafkaWire
from tests.integration.test_old_protocol import (
    fetch_old,
    legacy,
    legacy_messages,
    list_offsets_v0,
    old_part,
    old_request,
    produce_old,
    read_all_old,
)
from tests.strategies import BatchSpec, build_batch
from tests.strategies import Record as V2Record
from tests.unit.test_legacy_records import INNER0, INNER1, REFUSED, T, plain, wrapper

# Where Kafka fails with an exception it did not expect (UNKNOWN_SERVER_ERROR), kafscale answers the code the
# unit tests name (CORRUPT_MESSAGE, INVALID_RECORD or INVALID_TIMESTAMP): docs/compatibility.md.
KAFKA_UNEXPECTED = {"codec 5", "gzip that is not", "magic 1 lz4 with the pre-0.10 header checksum",
                    "negative timestamp", "key longer than the message", "magic 1 without room for its timestamp"}
UNKNOWN_SERVER_ERROR = -1

Wires = dict[str, KafkaWire]  # "kafka", "kafscale"


@pytest.fixture
def wires(kafka_reference_39: ReferenceKafka, kafscale: Cluster) -> Iterator[Wires]:
    """A raw connection to Apache Kafka 3.9.2 and one to kafscale (the folder's `kafscale`, in conftest.py)."""
    kafka = KafkaWire(kafka_reference_39.port)
    ours = KafkaWire(kafscale.port)
    try:
        yield {"kafka": kafka, "kafscale": ours}
    finally:
        kafka.close()
        ours.close()


def new_topic(wires: Wires, partitions: int = 1, configs: dict[str, str | None] | None = None) -> str:
    """One new topic on both, every partition ready to take records (Kafka elects leaders a moment later)."""
    name = f"old-{uuid.uuid4().hex[:10]}"
    for wire in wires.values():
        wire.create_topic(name, partitions, configs)
        deadline = time.monotonic() + 30
        while any(list_offsets_v1(wire, name, p) for p in range(partitions)):
            assert time.monotonic() < deadline, f"{name} has no leaders"
            time.sleep(0.1)
    return name


def list_offsets_v1(wire: KafkaWire, topic: str, partition: int) -> int:
    wanted = old_part(2, 1, "ListOffsetsPartition", partition_index=partition, timestamp=-1)
    answer = wire.call(old_request(2, 1, replica_id=-1, topics=(
        old_part(2, 1, "ListOffsetsTopic", name=topic, partitions=(wanted,)),)))
    return int(answer.topics[0].partitions[0].error_code)


def readable(wires: Wires, topic: str, partitions: int = 1) -> None:
    """Wait until a fetch from offset 0 of every partition answers without error on both. Under load the reference
    (Kafka 3.9.2) answered a fetch right after an acknowledged produce with OFFSET_OUT_OF_RANGE and high watermark
    -1 for a moment (twice in two loaded full runs); what is compared below is the answer once the data is there."""
    for wire in wires.values():
        deadline = time.monotonic() + 30
        while any(a.error_code for a in fetch_old(wire, 3, [(topic, p, 0, 1) for p in range(partitions)])):
            assert time.monotonic() < deadline, f"{topic} is not readable from offset 0"
            time.sleep(0.1)


def both(wires: Wires, call: Callable[[KafkaWire], Any]) -> tuple[Any, Any]:
    return call(wires["kafka"]), call(wires["kafscale"])


# ------------------------------------------------------------------------------------------------ Produce v0-v2


def test_refused_message_sets_get_the_same_codes(wires: Wires) -> None:
    topic = new_topic(wires)
    for name, (records, code) in REFUSED.items():
        version = 2 if records[16] else 1
        kafka, ours = both(wires, lambda w, r=records, v=version: produce_old(w, v, topic, 0, r))
        assert ours.error_code == code, name
        assert kafka.error_code == (UNKNOWN_SERVER_ERROR if name in KAFKA_UNEXPECTED else code), name
        assert kafka.base_offset == ours.base_offset == -1, name
    assert both(wires, lambda w: fetch_old(w, 2, [(topic, 0, 0, 1 << 20)])[0].high_watermark) == (0, 0)


ACCEPTED = [
    (0, plain(0, 0, -1, b"k", b"v") + plain(7, 0, -1, None, None)),
    (1, wrapper(0, 1, INNER0, 1)),
    (1, wrapper(0, 2, INNER0, 1)),
    (1, wrapper(0, 3, INNER0, 1)),  # lz4 with the pre-0.10 header checksum, as magic 0 had it
    (2, plain(0, 1, T, b"k", b"v") + plain(0, 1, T + 9, b"k2", b"v2")),
    (2, wrapper(1, 1, INNER1, 1, T + 1)),
    (2, wrapper(1, 2, INNER1, 1, T + 1)),
    (2, wrapper(1, 3, INNER1, 1, T + 1)),
    (2, wrapper(1, 1, plain(0, 1, T, b"a", b"1") + plain(5, 1, T, b"b", b"2"), 0)),  # wrapper offset 0 (librdkafka)
    (2, wrapper(1, 1, INNER1, 99, T + 7, 0x08)),  # a claimed LogAppendTime with a time: CreateTime on this topic
    (2, plain(0, 1, T, b"k", b"v", 0x08)),
    (0, plain(0, 0, -1, b"k", b"v") + plain(0, 0, -1, b"k", b"v")[:20]),  # the partial message is left out
    (1, b""),  # no message at all: success, base offset -1
    (2, bytes(build_batch(BatchSpec(0, False, -1, -1, -1, (V2Record(T, b"k", b"v2", ()),)), 0))),  # a v2 batch
]


def test_accepted_message_sets_get_the_same_offsets_and_read_back_the_same(wires: Wires) -> None:
    topic = new_topic(wires)
    for version, records in ACCEPTED:
        kafka, ours = both(wires, lambda w, v=version, r=records: produce_old(w, v, topic, 0, r))
        assert (kafka.error_code, kafka.base_offset) == (ours.error_code, ours.base_offset) == (0, kafka.base_offset)
        if version >= 2:
            assert kafka.log_append_time == ours.log_append_time is None
    readable(wires, topic)
    for version in (0, 1, 2, 3):
        kafka, ours = both(wires, lambda w, v=version: read_all_old(w, v, topic, 0))
        assert kafka == ours and len(ours) == 23, version


def test_log_append_time_topics_stamp_what_old_producers_send(wires: Wires) -> None:
    topic = new_topic(wires, configs={"message.timestamp.type": "LogAppendTime"})
    sets = [(0, legacy(0, "a", 2)[0]), (2, legacy(1, "b", 2)[0]), (2, legacy(1, "c", 2, codec=1)[0]),
            (2, plain(0, 1, T, b"k", b"v", 0x08))]  # claimed LogAppendTime: refused on such a topic
    for name, wire in wires.items():
        before = int(time.time() * 1000)
        answers = [produce_old(wire, v, topic, 0, r) for v, r in sets]
        after = int(time.time() * 1000)
        assert [(a.error_code, a.base_offset) for a in answers] == [(0, 0), (0, 2), (0, 4), (32, -1)], name
        for answer in answers[1:3]:
            assert before <= answer.log_append_time.timestamp() * 1000 <= after + 1, name
        for version in (2, 3):
            got = read_all_old(wire, version, topic, 0)
            assert [m[0] for m in got] == list(range(6)) and all(before <= m[1] <= after + 1 for m in got), name
        assert [m[1] for m in read_all_old(wire, 0, topic, 0)] == [None] * 6


# ------------------------------------------------------------------------------------------------ Fetch v0-v3


def test_fetch_v0_v3_answers_the_same_bytes(wires: Wires) -> None:
    """One uncompressed batch per partition, written by Produce v3 (so both store the same bytes): every old fetch
    answers the very same records field, down to the cut partial message and the overflow padding."""
    topic = new_topic(wires, partitions=2)
    first = bytes(build_batch(BatchSpec(0, False, -1, -1, -1, tuple(
        V2Record(T + i, b"k%d" % i, b"v%d" % i, (("h", b"x" * 40),)) for i in range(3))), 0))
    second = bytes(build_batch(BatchSpec(0, False, -1, -1, -1, tuple(
        V2Record(T + i, b"k%d" % i, b"v" * i, ()) for i in range(30))), 0))
    for wire in wires.values():
        assert produce_old(wire, 3, topic, 0, first).error_code == 0
        assert produce_old(wire, 3, topic, 1, second).error_code == 0
    readable(wires, topic, 2)
    cases: list[tuple[list[tuple[str, int, int, int]], int]] = [
        ([(topic, 0, 0, 1 << 20)], 1 << 24),  # headers dropped: shorter, padded with an overflow entry
        ([(topic, 1, 0, 1 << 20)], 1 << 24),  # thirty small records: longer, cut inside a message
        ([(topic, 1, 17, 1 << 20)], 1 << 24),  # records below the offset are left out
        ([(topic, 0, 0, 10)], 1 << 24),  # v0-v2: nothing; v3: the first partition's first batch anyway
        ([(topic, 0, 0, 10), (topic, 1, 0, 10)], 1 << 24),
        ([(topic, 0, 0, 1 << 20), (topic, 1, 0, 1 << 20)], len(first) + 10),  # v3: the second waits
        ([(topic, 1, 30, 1 << 20), (topic, 0, 3, 1 << 20)], 1 << 24),  # at the high watermark
        ([(topic, 1, 31, 1 << 20), (topic, 5, 0, 1 << 20)], 1 << 24),  # out of range, no such partition
    ]
    for version in (0, 1, 2, 3):
        for wanted, max_bytes in cases:
            kafka, ours = both(wires, lambda w, v=version, p=wanted, m=max_bytes: [
                (a.partition_index, a.error_code, a.high_watermark, bytes(a.records or b""))
                for a in fetch_old(w, v, p, max_bytes=m)])
            assert kafka == ours, (version, wanted, max_bytes)


def test_fetch_of_a_zstd_topic_below_v10_is_refused_alike(wires: Wires) -> None:
    topic = new_topic(wires, configs={"compression.type": "zstd"})
    for version in (0, 3):
        kafka, ours = both(wires, lambda w, v=version: [(a.error_code, a.high_watermark)
                                                        for a in fetch_old(w, v, [(topic, 0, 0, 1 << 20)])])
        assert kafka == ours == [(ErrorCode.unsupported_compression_type, -1)]


# ------------------------------------------------------------------------------------------------ ListOffsets v0


def test_list_offsets_v0_answers_the_same_offsets(wires: Wires) -> None:
    topic = new_topic(wires, partitions=2)
    for wire in wires.values():
        produce_old(wire, 0, topic, 0, legacy(0, "a", 3)[0])
        produce_old(wire, 2, topic, 0, legacy(1, "b", 2, codec=1)[0])
    future = int(time.time() * 1000) + 3_600_000
    cases = [(0, -1, 1), (0, -1, 10), (0, -2, 10), (0, 0, 10), (0, future, 10), (0, future, 1), (0, -1, 0),
             (0, -3, 3), (1, -1, 10), (1, -2, 10), (1, 0, 10), (1, future, 10), (7, -1, 1)]
    for partition, timestamp, max_num in cases:
        kafka, ours = both(wires, lambda w, p=partition, t=timestamp, n=max_num: list_offsets_v0(w, topic, p, t, n))
        assert kafka == ours, (partition, timestamp, max_num)
    # A negative max_num_offsets: Kafka fails on a negative array size; kafscale calls the request invalid.
    kafka, ours = both(wires, lambda w: list_offsets_v0(w, topic, 0, -1, -1))
    assert (kafka, ours) == ((UNKNOWN_SERVER_ERROR, ()), (ErrorCode.invalid_request, ()))


# ------------------------------------------------------------------------------------------------ groups


def coordinator_ready(wire: KafkaWire, group: str) -> None:
    """FindCoordinator answers, and the coordinator has loaded the group's offsets partition: a Kafka coordinator
    still loading it answers DescribeGroups COORDINATOR_LOAD_IN_PROGRESS (and other requests wrongly, early in a
    loaded run)."""
    deadline = time.monotonic() + 60
    while wire.call(old_request(10, 0, key=group)).error_code or \
            wire.call(old_request(15, 0, groups=(group,))).groups[0].error_code:
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_group_v0_join_sync_heartbeat_leave_alike(wires: Wires) -> None:
    group = f"old-group-{uuid.uuid4().hex[:8]}"
    answers = {}
    for name, wire in wires.items():
        coordinator_ready(wire, group)
        # A session long enough that a slow machine never expires the member between its steps (seen under load:
        # the two brokers then differ in nothing but which one was slower).
        joined = wire.call(old_request(11, 0, group_id=group, session_timeout=datetime.timedelta(seconds=60),
                                       member_id="", protocol_type="consumer", protocols=(
                                           old_part(11, 0, "JoinGroupRequestProtocol", name="range", metadata=b"m"),)))
        me, generation = joined.member_id, joined.generation_id
        synced = wire.call(old_request(14, 0, group_id=group, generation_id=generation, member_id=me, assignments=(
            old_part(14, 0, "SyncGroupRequestAssignment", member_id=me, assignment=b"mine"),)))
        beats = [wire.call(old_request(12, 0, group_id=group, generation_id=g, member_id=m)).error_code
                 for g, m in ((generation, me), (generation + 1, me), (generation, "nobody"))]
        left = wire.call(old_request(13, 0, group_id=group, member_id=me))
        answers[name] = (joined.error_code, generation, joined.protocol_name, joined.leader == me,
                         [(m.member_id == me, m.metadata) for m in joined.members], synced.error_code,
                         synced.assignment, beats, left.error_code)
    assert answers["kafka"] == answers["kafscale"]
    assert answers["kafka"][0] == 0 and answers["kafka"][6] == b"mine"


def commit(wire: KafkaWire, version: int, group: str, topic: str, partition: int, offset: int, **member: Any) -> int:
    wanted = old_part(8, version, "OffsetCommitRequestPartition", partition_index=partition, committed_offset=offset,
                      committed_metadata=f"v{version}", commit_timestamp=-1)
    answer = wire.call(old_request(8, version, group_id=group, topics=(
        old_part(8, version, "OffsetCommitRequestTopic", name=topic, partitions=(wanted,)),), **member))
    return int(answer.topics[0].partitions[0].error_code)


def fetched(wire: KafkaWire, version: int, group: str, topic: str) -> list[tuple[int, int, str, int]]:
    answer = wire.call(old_request(9, version, group_id=group, topics=(
        old_part(9, version, "OffsetFetchRequestTopic", name=topic, partition_indexes=(0, 1)),)))
    return sorted((p.partition_index, p.committed_offset, p.metadata, int(p.error_code))
                  for p in answer.topics[0].partitions)


def test_offset_commit_and_fetch_v1_alike_and_v0_served_where_kafka_3_9_refuses_it(wires: Wires) -> None:
    topic = new_topic(wires, partitions=2)
    group = f"old-offsets-{uuid.uuid4().hex[:8]}"
    standalone = {"generation_id_or_member_epoch": -1, "member_id": ""}
    for wire in wires.values():
        coordinator_ready(wire, group)
        deadline = time.monotonic() + 30
        while commit(wire, 1, group, topic, 1, 2, **standalone):  # the offsets topic may still be loading
            assert time.monotonic() < deadline
            time.sleep(0.2)
    for args, member in (((1, 0, 5), standalone), ((1, 0, 6), {"generation_id_or_member_epoch": 5, "member_id": "x"}),
                         ((1, 9, 6), standalone)):
        kafka, ours = both(wires, lambda w, a=args, m=member: commit(w, a[0], group, topic, a[1], a[2], **m))
        assert kafka == ours, args
    kafka, ours = both(wires, lambda w: fetched(w, 1, group, topic))
    assert kafka == ours == [(0, 5, "v1", 0), (1, 2, "v1", 0)]
    # v0 kept offsets in ZooKeeper, which Kafka 3.9 in KRaft mode has not: it refuses v0 in every partition.
    # Kafscale has one offset store and serves v0 from it.
    kafka, ours = both(wires, lambda w: commit(w, 0, group, topic, 0, 9))
    assert (kafka, ours) == (ErrorCode.unsupported_version, 0)
    kafka, ours = both(wires, lambda w: fetched(w, 0, group, topic))
    assert kafka == [(0, -1, "", 35), (1, -1, "", 35)] and ours == [(0, 9, "v0", 0), (1, 2, "v1", 0)]


def test_old_versions_are_advertised_as_kafka_3_9_advertises_them(wires: Wires) -> None:
    kafka, ours = both(wires, lambda w: {a.api_key: a.min_version for a in w.call(old_request(18, 0)).api_keys})
    old_paths = (0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 16)
    assert [ours[k] for k in old_paths] == [kafka[k] for k in old_paths] == [0] * len(old_paths)


@pytest.mark.parametrize("api_version", [(0, 9), (0, 10, 0)])
def test_kafka_python_speaking_old_versions_gets_the_same_offsets_and_records(
        wires: Wires, kafka_reference_39: ReferenceKafka, kafscale: Cluster,
        api_version: tuple[int, ...]) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    topic = new_topic(wires)
    seen = []
    for bootstrap in (kafka_reference_39.bootstrap, kafscale.bootstrap):
        producer = KafkaProducer(bootstrap_servers=bootstrap, api_version=api_version, compression_type="gzip")
        offsets = [producer.send(topic, key=b"k%d" % i, value=b"v%d" % i, partition=0).get(30).offset
                   for i in range(12)]
        producer.close()
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, api_version=api_version, group_id=None,
                                 auto_offset_reset="earliest", consumer_timeout_ms=5_000)
        consumer.assign([TopicPartition(topic, 0)])
        records = [(m.offset, m.key, m.value) for m in consumer]
        consumer.close()
        seen.append((offsets, records))
    assert seen[0] == seen[1]
    assert seen[0][0] == list(range(12)) and [r[2] for r in seen[0][1]] == [b"v%d" % i for i in range(12)]


def test_compressed_sets_read_back_alike_by_every_old_fetch(wires: Wires) -> None:
    """Compressed sets come back from each broker compressed by itself (different bytes, the same messages)."""
    topic = new_topic(wires)
    for wire in wires.values():
        for version, magic in ((1, 0), (2, 1)):
            for codec in (1, 2, 3):
                produce_old(wire, version, topic, 0, legacy(magic, f"m{magic}c{codec}", 4, codec)[0])
        produce_old(wire, 2, topic, 0, message_set(1, 1, [Record(0, T, None, b"x" * 5000)]))
    for version in (0, 1, 2, 3):
        kafka, ours = both(wires, lambda w, v=version: read_all_old(w, v, topic, 0))
        assert kafka == ours and len(ours) == 25, version
        # From inside a wrapper: it comes whole, from its first message (what follows it may differ: kafscale
        # reads one of its segments per fetch, and its segments are not Kafka's).
        kafka, ours = both(wires, lambda w, v=version: legacy_messages(bytes(
            fetch_old(w, v, [(topic, 0, 5, 1 << 20)])[0].records))[:4])
        assert kafka == ours and [m[0] for m in ours] == [4, 5, 6, 7], version
