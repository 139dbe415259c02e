"""The isolation level without Spark: the option, the last stable offset, which aborted transactions a slice
carries, and which batches it drops."""

from __future__ import annotations

import pytest

from kafscale.cluster.records import AbortedTxn, SegmentMeta
from kafscale.pipeline.committed import PartitionLog, Snapshot, TopicMeta, last_stable_offset
from kafscale.pipeline.planning import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    SourceOptions,
    isolation_level,
    overlapping_aborted,
    plan_slices,
    resolve_offsets,
    starting_offsets,
)
from kafscale.pipeline.slices import is_aborted
from kafscale.storage.batch import CONTROL_BIT, TRANSACTIONAL_BIT, BatchHeader

P, Q = 1000, 2000


def test_read_committed_is_the_default_and_either_option_name_sets_the_level() -> None:
    assert isolation_level({}) == READ_COMMITTED
    assert isolation_level({"kafka.isolation.level": "read_uncommitted"}) == READ_UNCOMMITTED
    assert isolation_level({"Kafka.Isolation.Level": "READ_UNCOMMITTED"}) == READ_UNCOMMITTED
    assert isolation_level({"isolationLevel": "read_committed"}) == READ_COMMITTED
    assert isolation_level({"isolationLevel": "read_uncommitted",
                            "kafka.isolation.level": "read_uncommitted"}) == READ_UNCOMMITTED
    with pytest.raises(ValueError, match="disagree"):
        isolation_level({"isolationLevel": "read_uncommitted", "kafka.isolation.level": "read_committed"})
    with pytest.raises(ValueError, match="read_committed or read_uncommitted"):
        isolation_level({"kafka.isolation.level": "serializable"})
    opts = SourceOptions.parse({"topic": "t", "kafscale.data.dir": "/nowhere"})
    assert opts.isolation_level == READ_COMMITTED and opts.read_committed


def test_the_last_stable_offset_is_the_earliest_open_transaction_or_the_high_watermark() -> None:
    assert last_stable_offset(0, 50, []) == 50
    assert last_stable_offset(0, 50, [{"epoch": 0, "batches": []}, {"epoch": 1, "batches": [], "txn_first": 30},
                                      {"epoch": 0, "batches": [], "txn_first": 12}]) == 12
    assert last_stable_offset(0, 50, [{"epoch": 0, "batches": [], "txn_first": -1}]) == 50
    assert last_stable_offset(20, 50, [{"epoch": 0, "batches": [], "txn_first": 12}]) == 20  # never below the start


def _seg(base: int, last: int, aborted: tuple[AbortedTxn, ...] = ()) -> SegmentMeta:
    return SegmentMeta(base, last, 1000, last - base + 1, 0, 0, 0, 0, aborted=aborted)


def _snapshot() -> Snapshot:
    """Offsets 0-39 in four segments. P's transaction 5-9 aborted by its marker at 12 (in the second segment);
    Q's 22-24 aborted at 31 (fourth segment); an open transaction starts at 33: the LSO."""
    p_abort, q_abort = AbortedTxn(P, 5, 12), AbortedTxn(Q, 22, 31)
    segments = (_seg(0, 9), _seg(10, 19, (p_abort,)), _seg(20, 29), _seg(30, 39, (q_abort,)))
    log = PartitionLog("t", 0, 0, 40, segments, 33, (p_abort, q_abort))
    return Snapshot({"t": TopicMeta("t", 1)}, {("t", 0): log})


def _opts(level: str | None) -> SourceOptions:
    options = {"topic": "t", "kafscale.data.dir": "/nowhere"}
    if level:
        options["kafka.isolation.level"] = level
    return SourceOptions.parse(options)


def test_read_committed_ends_at_the_lso_and_slices_carry_the_aborted_ranges_they_overlap() -> None:
    snap, opts = _snapshot(), _opts(None)
    start, end = starting_offsets(opts, snap), resolve_offsets(opts, snap, "latest", ending=True)
    assert (start, end) == ({("t", 0): 0}, {("t", 0): 33})
    assert resolve_offsets(opts, snap, '{"t": {"0": 39}}', ending=True) == {("t", 0): 33}  # cut back to the LSO
    assert resolve_offsets(opts, snap, "latest") == {("t", 0): 33}  # startingOffsets latest: the LSO too
    slices = plan_slices(opts, snap, start, end)
    assert [(s.segment.base, s.start_offset, s.end_offset) for s in slices] == [(0, 0, 33), (10, 0, 33),
                                                                                (20, 0, 33), (30, 0, 33)]
    # P's aborted records are in the first segment although its marker is in the second; Q's marker lies past
    # the LSO, its records before it.
    assert [s.aborted for s in slices] == [(AbortedTxn(P, 5, 12),), (AbortedTxn(P, 5, 12),),
                                           (AbortedTxn(Q, 22, 31),), (AbortedTxn(Q, 22, 31),)]
    later = plan_slices(opts, snap, {("t", 0): 13}, end)
    assert [s.aborted for s in later] == [(), (AbortedTxn(Q, 22, 31),), (AbortedTxn(Q, 22, 31),)]


def test_read_uncommitted_ends_at_the_high_watermark_and_drops_nothing() -> None:
    snap, opts = _snapshot(), _opts("read_uncommitted")
    end = resolve_offsets(opts, snap, "latest", ending=True)
    assert end == {("t", 0): 40}
    slices = plan_slices(opts, snap, starting_offsets(opts, snap), end)
    assert len(slices) == 4 and all(s.aborted == () for s in slices)


def test_overlapping_aborted_keeps_ranges_that_touch_the_interval() -> None:
    a, b = AbortedTxn(P, 5, 12), AbortedTxn(Q, 22, 31)
    assert overlapping_aborted((a, b), 0, 5) == ()
    assert overlapping_aborted((a, b), 0, 6) == (a,)
    assert overlapping_aborted((a, b), 12, 22) == (a,)
    assert overlapping_aborted((a, b), 13, 22) == ()
    assert overlapping_aborted((a, b), 10, 40) == (a, b)


def _header(base: int, count: int, pid: int, attributes: int) -> BatchHeader:
    return BatchHeader(base, 100, 0, 2, 0, attributes, count - 1, 0, 0, pid, 0, 0, count)


def test_a_batch_is_dropped_only_if_it_is_transactional_and_in_its_own_producers_aborted_range() -> None:
    aborted = (AbortedTxn(P, 5, 12),)
    assert is_aborted(_header(5, 3, P, TRANSACTIONAL_BIT), aborted)
    assert is_aborted(_header(9, 2, P, TRANSACTIONAL_BIT), aborted)
    assert not is_aborted(_header(13, 2, P, TRANSACTIONAL_BIT), aborted)  # P's next transaction
    assert not is_aborted(_header(3, 2, P, TRANSACTIONAL_BIT), aborted)  # P's previous one
    assert not is_aborted(_header(7, 2, Q, TRANSACTIONAL_BIT), aborted)  # another producer's, interleaved
    assert not is_aborted(_header(7, 2, P, 0), aborted)  # not transactional
    assert not is_aborted(_header(12, 1, P, TRANSACTIONAL_BIT | CONTROL_BIT), aborted)  # the marker: decoder drops it
