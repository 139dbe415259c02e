"""Fetch's answers beside Kafka's: a partition named twice, and what an error partition tells.

Kafka reads a Fetch request into a map, so a partition named twice is answered once, where it was first named, at
the offset it was last named with; and a partition answered with an error carries no offsets (high watermark, last
stable offset and log start offset all -1).
"""

from __future__ import annotations

import datetime
from typing import Any

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
