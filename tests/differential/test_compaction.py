"""Compacted topics against Apache Kafka 4.4.0: what a producer is refused, and what a consumer reads after a
cleaning, across the ranges it removed (the configs themselves: test_configs.py).

Both brokers clean on their own (Kafka's cleaner every 500 ms here, Kafscale's likewise): a case waits until the
first record it expects gone is gone, then reads. Kafka never cleans its active segment, so each case rolls it
(`segment.ms`, by record timestamps) with one last record before waiting; Kafscale has no active segment and
cleans that record too, which changes nothing since it is its key's only value.
"""

from __future__ import annotations

import time
from collections.abc import Callable
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
    horizon, records as (offset, key, value)); a transaction marker's records as "marker" (its value holds the
    coordinator's epoch, which differs between the brokers)."""
    found: list[tuple[Any, ...]] = []
    deadline = time.monotonic() + 30
    while True:
        answer = peer.fetch(topic, 0, offset)
        assert code(answer.error_code) == "NONE", (peer.name, answer)
        stream = MemoryRecords(bytes(answer.records or b""))
        while (b := stream.next_batch()) is not None:
            if b.next_offset > offset:
                found.append((b.base_offset, b.next_offset - 1, bool(b.attributes & HORIZON),
                              "marker" if b.is_control_batch else [(r.offset, r.key, r.value) for r in b]))
                offset = b.next_offset
        if offset >= answer.high_watermark:
            return found
        assert time.monotonic() < deadline, (peer.name, offset, answer)


def offsets(peer: Peer, topic: str) -> tuple[int, int]:
    answer = peer.list_offsets(topic, [(0, -2)])[0], peer.list_offsets(topic, [(0, -1)])[0]
    return int(answer[0].offset), int(answer[1].offset)


def compacted(peer: Peer, topic: str, rows: list[tuple[bytes, bytes | None]], gone: int,
              write: Callable[[Peer], int] | None = None) -> dict[str, Any]:
    """Produce `rows` one batch each (or `write` them: it returns how many offsets it wrote), roll, wait until the
    record at `gone` is cleaned away, then read from each offset written. Batches a cleaning left empty are not
    shown: Kafka keeps a producer's last batch, empty, for its producer state (rebuilt from the log when a broker
    restarts); Kafscale keeps producer state in the metadata store and drops the batch. Clients skip both."""
    peer.create_ready(topic, 1, COMPACTED)
    for i, (key, value) in enumerate(rows):
        assert peer.append(topic, 0, [(key, value, T0 + i)]) == i, peer.name
    written = write(peer) if write is not None else len(rows)
    # Kafka rolls by record timestamps: one segment.ms past the first record's of the active segment (a marker's is
    # the broker's clock), the next record starts a segment and the rows' segments become cleanable.
    roll = int(time.time() * 1000) + 60_000
    assert peer.append(topic, 0, [(b"last", b"roll", roll)]) == written, peer.name
    deadline = time.monotonic() + 60
    while any(batch[0] <= gone <= batch[1] and batch[3] for batch in read(peer, topic, 0)):
        assert time.monotonic() < deadline, (peer.name, "no cleaning", read(peer, topic, 0))
        time.sleep(0.2)
    return {"from": {offset: [b for b in read(peer, topic, offset) if b[3]] for offset in range(written + 1)},
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



def test_a_cleaning_removes_aborted_records_and_keeps_the_markers_a_reader_still_needs(peers: Peers,
                                                                                     topic: str) -> None:
    """A committed transaction writes a=a0 (0, its marker at 1), an aborted one a=a1 (2, its marker at 3), then
    b=b0 plain (4). The aborted value is removed and never wins over a0; the commit marker stays (its transaction
    still has a record here); so does the abort marker: its transaction had a batch in this pass (the pass that
    removed it). The next pass sees none and sets the marker's delete horizon (test_cleaner.py)."""
    from tests.differential.test_transactions import Txn

    def write(peer: Peer) -> int:
        for end, (value, commit) in ((2, (b"a0", True)), (4, (b"a1", False))):
            txn = Txn(peer)
            assert txn.add_partitions({topic: [0]}) == {f"{topic}:0": "NONE"}
            assert txn.produce(topic, 0, [(b"a", value, T0)])[0] == "NONE"
            assert txn.end(commit) == "NONE"
            deadline = time.monotonic() + 30
            while offsets(peer, topic)[1] < end:  # Kafka writes the marker after it answers EndTxn
                assert time.monotonic() < deadline, peer.name
                time.sleep(0.05)
        assert peer.append(topic, 0, [(b"b", b"b0", T0)]) == 4, peer.name
        return 5

    got = {peer.name: compacted(peer, topic, [], gone=2, write=write) for peer in peers}
    kept = [(0, 0, False, [(0, b"a", b"a0")]), (1, 1, False, "marker"), (3, 3, False, "marker"),
            (4, 4, False, [(4, b"b", b"b0")]), (5, 5, False, [(5, b"last", b"roll")])]
    assert got["kafka"] == {"from": {0: kept, 1: kept[1:], 2: kept[2:], 3: kept[2:], 4: kept[3:], 5: kept[4:]},
                            "offsets": (0, 6)}
    assert got["kafscale"] == got["kafka"]
