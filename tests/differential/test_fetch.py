"""Fetch's answers beside Kafka's: a partition named twice, and what an error partition tells.

Kafka reads a Fetch request into a map, so a partition named twice is answered once, where it was first named, at
the offset it was last named with; and a partition answered with an error carries no offsets (high watermark, last
stable offset and log start offset all -1).
"""

from __future__ import annotations

import datetime
from typing import Any

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from tests.differential.wire import DELETE_RECORDS, FETCH, METADATA, T0, TIMEOUT, Peer, Peers, code, req, sub


def fetch(peer: Peer, topic: str, parts: list[tuple[int, int]]) -> list[tuple[Any, ...]]:
    """(partition, error, high watermark, last stable offset, log start, record bytes) per partition answered."""
    answer = peer.call(req(FETCH, replica_id=-1, max_wait=datetime.timedelta(milliseconds=10), min_bytes=0,
                           max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
                           topics=(sub(FETCH, "FetchTopic", topic=topic, partitions=tuple(
                               sub(FETCH, "FetchPartition", partition=p, current_leader_epoch=-1, fetch_offset=o,
                                   last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)
                               for p, o in parts)),),
                           forgotten_topics_data=(), rack_id=""))
    assert code(answer.error_code) == "NONE"
    return [(p.partition_index, code(p.error_code), p.high_watermark, p.last_stable_offset, p.log_start_offset,
             len(p.records or b"")) for t in answer.responses for p in t.partitions]


def test_partitions_named_twice_and_partitions_in_error(peers: Peers, topic: str) -> None:
    seen: dict[str, dict[str, list[tuple[Any, ...]]]] = {}
    for peer in peers:
        peer.create_ready(topic, 2)
        peer.append(topic, 0, [(b"k0", b"v0", T0)])  # offset 0
        peer.append(topic, 0, [(b"k1", b"v1", T0), (b"k2", b"v2", T0)])  # offsets 1-2, one batch
        deleted = peer.call(req(DELETE_RECORDS, timeout=TIMEOUT, topics=(sub(
            DELETE_RECORDS, "DeleteRecordsTopic", name=topic, partitions=(
                sub(DELETE_RECORDS, "DeleteRecordsPartition", partition_index=0, offset=1),)),)))
        assert code(deleted.topics[0].partitions[0].error_code) == "NONE"
        seen[peer.name] = {
            "twice at the log start": fetch(peer, topic, [(0, 1), (0, 1)]),
            "twice, the second below the log start": fetch(peer, topic, [(0, 1), (1, 0), (0, 0)]),
            "twice, the second in range": fetch(peer, topic, [(0, 0), (1, 0), (0, 2)]),
            "below the log start": fetch(peer, topic, [(0, 0)]),
            "past the high watermark, and one in range": fetch(peer, topic, [(0, 9), (1, 0)]),
            "an unknown partition": fetch(peer, topic, [(7, 0)]),
        }
    kafka, ours = seen.values()
    assert ours == kafka
    assert kafka["twice, the second below the log start"] == [
        (0, "OFFSET_OUT_OF_RANGE", -1, -1, -1, 0), (1, "NONE", 0, 0, 0, 0)]
    assert [row[:5] for row in kafka["twice, the second in range"]] == [(0, "NONE", 3, 3, 1), (1, "NONE", 0, 0, 0)]


def fetch_at(peer: Peer, version: int, topic: str) -> tuple[str, str, bool]:
    """Fetch partition 0 from offset 0 at `version`: (top-level error, partition error, whether records came)."""
    answer = peer.call(req(FETCH, version, replica_id=-1, max_wait=datetime.timedelta(milliseconds=10), min_bytes=0,
                           max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
                           topics=(sub(FETCH, "FetchTopic", version, topic=topic, partitions=(
                               sub(FETCH, "FetchPartition", version, partition=0, current_leader_epoch=-1,
                                   fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1,
                                   partition_max_bytes=1 << 20),)),),
                           forgotten_topics_data=(), rack_id=""))
    (p,) = answer.responses[0].partitions
    return code(getattr(answer, "error_code", 0)), code(p.error_code), bool(p.records)


def test_zstd_data_to_a_fetch_older_than_v10(peers: Peers, topic: str) -> None:
    """zstd came with Fetch v10 (KIP-110), yet Kafka 4 hands zstd batches to Fetch v4-v9 as they are stored, on a
    zstd topic and on a producer-codec one alike (its refusal went with down-conversion, which only v0-v3 get):
    so does Kafscale. Checked here because it is easy to assume otherwise."""
    seen = {}
    for peer in peers:
        peer.create_ready(topic, 1, {"compression.type": "zstd"})
        peer.create_ready(f"{topic}-producer", 1)
        peer.append(topic, 0, [(b"k", b"v" * 100, T0)])  # stored zstd: the topic's codec
        zstd = DefaultRecordBatchBuilder(magic=2, compression_type=4, is_transactional=0, producer_id=-1,
                                         producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
        zstd.append(0, timestamp=T0, key=b"k", value=b"v" * 100, headers=[])
        assert code(peer.produce(f"{topic}-producer", 0, bytes(zstd.build())).error_code) == "NONE"
        seen[peer.name] = {(name, v): fetch_at(peer, v, name) for name in (topic, f"{topic}-producer")
                           for v in (4, 9, 10)}
    kafka, ours = seen.values()
    assert ours == kafka
    assert set(kafka.values()) == {("NONE", "NONE", True)}


def session_fetch(peer: Peer, version: int, session_id: int, epoch: int, topic: Any,
                  parts: dict[int, int], forgotten: tuple[int, ...] = ()) -> tuple[str, int, list[tuple[Any, ...]]]:
    """One fetch in a session (KIP-227) at `version` (a topic name before v13, its id from v13): (top-level error,
    session id, (partition, error, high watermark, log start, record bytes) per partition answered, sorted)."""
    key = "topic_id" if version >= 13 else "topic"
    answer = peer.call(req(FETCH, version, replica_id=-1, max_wait=datetime.timedelta(milliseconds=10), min_bytes=0,
                           max_bytes=1 << 20, isolation_level=0, session_id=session_id, session_epoch=epoch,
                           topics=(sub(FETCH, "FetchTopic", version, **{key: topic}, partitions=tuple(
                               sub(FETCH, "FetchPartition", version, partition=p, current_leader_epoch=-1,
                                   fetch_offset=o, last_fetched_epoch=-1, log_start_offset=-1,
                                   partition_max_bytes=1 << 20) for p, o in parts.items())),) if parts else (),
                           forgotten_topics_data=(sub(FETCH, "ForgottenTopic", version, **{key: topic},
                                                      partitions=forgotten),) if forgotten else (), rack_id=""))
    rows = sorted((p.partition_index, code(p.error_code), p.high_watermark, p.log_start_offset,
                   len(p.records or b"")) for t in answer.responses for p in t.partitions)
    return code(answer.error_code), answer.session_id, rows


def topic_id(peer: Peer, topic: str) -> Any:
    answer = peer.call(req(METADATA, topics=(sub(METADATA, "MetadataRequestTopic", name=topic, topic_id=None),),
                           allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    return answer.topics[0].topic_id


def session_steps(peer: Peer, topic: str) -> list[Any]:
    """The same fetches, in a session, to one broker: (step, error, whether a session id came, rows) each."""
    peer.create_ready(topic, 3)
    peer.append(topic, 0, [(b"k", b"a", T0)])
    peer.append(topic, 1, [(b"k", b"b", T0), (b"k", b"c", T0)])
    steps: list[Any] = []

    def step(name: str, *args: Any, **kwargs: Any) -> int:
        error, session_id, rows = session_fetch(peer, *args, **kwargs)
        steps.append((name, error, session_id > 0, rows))
        return session_id

    s = step("full fetch, epoch 0: opens a session", 12, 0, 0, topic, {0: 0, 1: 0, 2: 0})
    step("read to the end: nothing new", 12, s, 1, topic, {0: 1, 1: 2})
    peer.append(topic, 2, [(b"k", b"d", T0)])
    step("records in partition 2 only", 12, s, 2, topic, {})
    step("the same epoch again", 12, s, 2, topic, {})
    step("partition 2 forgotten, partition 0 out of range", 12, s, 3, topic, {0: 5}, forgotten=(2,))
    step("the error again, nothing else", 12, s, 4, topic, {})
    step("partition 0 back in range: told again", 12, s, 5, topic, {0: 1})
    step("a session id no one gave", 12, s ^ 0x40000000, 1, topic, {})
    step("topic ids in a session of names", 13, s, 6, topic_id(peer, topic), {})
    step("epoch -1: closes the session, opens none", 12, s, -1, topic, {1: 2})
    step("the closed session", 12, s, 7, topic, {})
    ids = step("full fetch by topic id", 13, 0, 0, topic_id(peer, topic), {0: 0})
    step("names in a session of topic ids", 12, ids, 1, topic, {})
    step("forgetting the only partition ends the session", 13, ids, 1, topic_id(peer, topic), {}, forgotten=(0,))
    step("the ended session", 13, ids, 2, topic_id(peer, topic), {})
    return steps


def test_fetch_sessions_answer_what_changed_and_refuse_as_kafka_does(peers: Peers, topic: str) -> None:
    """KIP-227's incremental fetches, step by step: which partitions each answer holds, and the session errors.
    Session ids are the brokers' own random numbers: compared as "one was given" and used as given."""
    kafka, ours = (session_steps(peer, topic) for peer in peers)
    assert ours == kafka
    assert [s[1] for s in kafka[3:4] + kafka[7:9]] == [
        "INVALID_FETCH_SESSION_EPOCH", "FETCH_SESSION_ID_NOT_FOUND", "FETCH_SESSION_TOPIC_ID_ERROR"]
    assert kafka[1][3] == [] and [r[0] for r in kafka[2][3]] == [2]
