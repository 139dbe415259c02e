"""retention_start: Kafka's rules for which prefix of segments retention deletes."""

from __future__ import annotations

from kafscale.broker.retention import retention_start
from kafscale.cluster.records import SegmentMeta


def seg(base: int, last: int, size: int, max_ts: int) -> SegmentMeta:
    return SegmentMeta(base, last, size, last - base + 1, max_ts - 1, max_ts, 0, max_ts)


SEGS = [seg(0, 9, 100, 1000), seg(10, 19, 100, 2000), seg(20, 29, 100, 3000), seg(30, 39, 100, 4000)]


def test_nothing_expires_without_limits() -> None:
    assert retention_start(SEGS, 0, -1, -1, now_ms=10**9) == 0


def test_time_deletes_only_a_prefix_of_expired_segments() -> None:
    assert retention_start(SEGS, 0, 1500, -1, now_ms=3600) == 20  # newest records at 1000, 2000 are too old
    unordered = [SEGS[0], seg(10, 19, 100, 9000), SEGS[2]]  # a newer segment in between stops deletion
    assert retention_start(unordered, 0, 1500, -1, now_ms=3600) == 10


def test_size_keeps_at_least_retention_bytes() -> None:
    assert retention_start(SEGS, 0, -1, 200, now_ms=0) == 20
    assert retention_start(SEGS, 0, -1, 201, now_ms=0) == 10
    assert retention_start(SEGS, 0, -1, 0, now_ms=0) == 40  # everything may go; the log end stays


def test_log_start_inside_a_segment_and_the_larger_of_both_rules() -> None:
    assert retention_start(SEGS, 25, -1, 100, now_ms=0) == 30
    assert retention_start(SEGS, 0, 1500, 300, now_ms=3600) == 20  # time says 2 segments, size 1
    assert retention_start(SEGS, 35, 10**9, -1, now_ms=0) == 35  # never moves backwards
