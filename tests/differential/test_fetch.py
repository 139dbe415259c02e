"""Fetch's answers beside Kafka's: a partition named twice, and what an error partition tells.

Kafka reads a Fetch request into a map, so a partition named twice is answered once, where it was first named, at
the offset it was last named with; and a partition answered with an error carries no offsets (high watermark, last
stable offset and log start offset all -1).
"""

from __future__ import annotations

import datetime
from typing import Any

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from tests.differential.wire import DELETE_RECORDS, FETCH, T0, TIMEOUT, Peer, Peers, code, req, sub


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
