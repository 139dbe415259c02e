"""Compacted topics against Apache Kafka 4.4.0: what a producer is refused, and what a consumer reads after a
cleaning, across the ranges it removed (the configs themselves: test_configs.py).

Both brokers clean on their own (Kafka's cleaner every 500 ms here, Kafscale's likewise): a case waits until the
first record it expects gone is gone, then reads. Kafka never cleans its active segment, so each case rolls it
(`segment.ms`, by record timestamps) with one last record before waiting; Kafscale has no active segment and
cleans that record too, which changes nothing since it is its key's only value.
"""

from __future__ import annotations

import time
from typing import Any

from aiokafka.record.memory_records import MemoryRecords

from tests.differential.wire import Peer, Peers, batch, code

T0 = 1_700_000_000_000
COMPACTED = {"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01"}
HORIZON = 0x40  # KIP-534's delete-horizon attribute


def test_a_compacted_topic_refuses_records_without_a_key(peers: Peers, topic: str) -> None:
    got = {}
    for peer in peers:
        peer.create_ready(topic, 1, {"cleanup.policy": "compact"})
        refused = peer.produce(topic, 0, batch([(b"k", b"v", T0), (None, b"v", T0), (None, b"x", T0)]))
        taken = peer.produce(topic, 0, batch([(b"k", None, T0)]))  # a tombstone has a key: fine
        got[peer.name] = {
            "refused": (code(refused.error_code), refused.error_message, int(refused.base_offset),
                        [(int(e.batch_index), e.batch_index_error_message) for e in refused.record_errors]),
            "taken": (code(taken.error_code), int(taken.base_offset)),
        }
    why = f"Compacted topic cannot accept message without key in topic partition {topic}-0"
    assert got["kafka"] == {
        "refused": ("INVALID_RECORD", "One or more records have been rejected due to 2 record errors in total, and "
                    f"only showing the first three errors at most: [RecordError(batchIndex=1, message='{why}'), "
                    f"RecordError(batchIndex=2, message='{why}')]", -1, [(1, why), (2, why)]),
        "taken": ("NONE", 0),
    }
    assert got["kafscale"] == got["kafka"]


def read(peer: Peer, topic: str, offset: int) -> list[tuple[Any, ...]]:
    """Every batch from `offset` to the high watermark, fetch after fetch: (base offset, last offset, has a delete
    horizon, records as (offset, key, value))."""
    found: list[tuple[Any, ...]] = []
    deadline = time.monotonic() + 30
    while True:
        answer = peer.fetch(topic, 0, offset)
        assert code(answer.error_code) == "NONE", (peer.name, answer)
        stream = MemoryRecords(bytes(answer.records or b""))
        while (b := stream.next_batch()) is not None:
            if b.next_offset > offset:
                found.append((b.base_offset, b.next_offset - 1, bool(b.attributes & HORIZON),
                              [(r.offset, r.key, r.value) for r in b]))
                offset = b.next_offset
        if offset >= answer.high_watermark:
            return found
        assert time.monotonic() < deadline, (peer.name, offset, answer)


def offsets(peer: Peer, topic: str) -> tuple[int, int]:
    answer = peer.list_offsets(topic, [(0, -2)])[0], peer.list_offsets(topic, [(0, -1)])[0]
    return int(answer[0].offset), int(answer[1].offset)


def compacted(peer: Peer, topic: str, rows: list[tuple[bytes, bytes | None]], gone: int) -> dict[str, Any]:
    """Produce `rows` one batch each, roll, wait until the record at `gone` is cleaned away, then read from each
    offset of the rows."""
    peer.create_ready(topic, 1, COMPACTED)
    for i, (key, value) in enumerate(rows):
        assert peer.append(topic, 0, [(key, value, T0 + i)]) == i, peer.name
    # Kafka rolls by record timestamps: one segment.ms past the first record's, the next record starts a segment
    # and the rows' segment becomes cleanable.
    assert peer.append(topic, 0, [(b"last", b"roll", T0 + 60_000)]) == len(rows), peer.name
    deadline = time.monotonic() + 60
    while read(peer, topic, 0)[0][0] <= gone:
        assert time.monotonic() < deadline, (peer.name, "no cleaning", read(peer, topic, 0))
        time.sleep(0.2)
    return {"from": {offset: read(peer, topic, offset) for offset in range(len(rows) + 1)},
            "offsets": offsets(peer, topic)}


def test_a_cleaning_keeps_the_latest_value_of_each_key_and_reads_skip_what_it_removed(peers: Peers,
                                                                                      topic: str) -> None:
    rows = [(b"a", b"a0"), (b"b", b"b0"), (b"a", b"a1"), (b"c", b"c0"), (b"b", None), (b"a", b"a2")]
    got = {peer.name: compacted(peer, topic, rows, gone=2) for peer in peers}
    kept = [(3, 3, False, [(3, b"c", b"c0")]), (4, 4, True, [(4, b"b", None)]), (5, 5, False, [(5, b"a", b"a2")]),
            (6, 6, False, [(6, b"last", b"roll")])]
    assert got["kafka"] == {"from": {0: kept, 1: kept, 2: kept, 3: kept, 4: kept[1:], 5: kept[2:], 6: kept[3:]},
                            "offsets": (0, 7)}
    assert got["kafscale"] == got["kafka"]

