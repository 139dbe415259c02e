"""The cleaning pass (kafscale.compaction.cleaner) on segments in memory: what it keeps, at which offsets, with which
timestamps and horizons, in how many passes, and the segments it writes."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafscale.cluster.records import AbortedTxn, SegmentMeta
from kafscale.compaction.cleaner import Job, Outcome, clean
from kafscale.storage.batch import read_header
from kafscale.storage.control import TxnMarker
from kafscale.storage.segment import SegmentReader, build_segment
from tests.strategies import BatchSpec, Record, build_batch, decode

NOW = 1_800_000_000_000
DAY = 86_400_000
Row = tuple[bytes | None, bytes | None]  # key, value (None: a tombstone)


class Log:
    """A partition's committed segments and the objects holding them, built batch by batch."""

    def __init__(self) -> None:
        self.segments: list[SegmentMeta] = []
        self.objects: dict[str, bytes] = {}
        self.next = 0
        self.aborted: list[AbortedTxn] = []

    def segment(self, *batches: bytearray) -> None:
        placed = []
        for b in batches:
            header = read_header(b)
            b[0:8] = self.next.to_bytes(8, "big")
            placed.append(b)
            self.next += header.last_offset_delta + 1
        built = build_segment(placed, created_ms=NOW - DAY)
        meta = SegmentMeta.from_info(built.info)
        self.put(meta, built.data, built.index)

    def put(self, meta: SegmentMeta, data: bytes, index: bytes) -> None:
        at = meta.stored("ns", "t", 0)
        self.objects[at.key], self.objects[at.index_key] = data, index
        self.segments.append(meta)

    def read(self, meta: SegmentMeta) -> bytes:
        return self.objects[meta.stored("ns", "t", 0).key]

    def clean(self, *, first_dirty: int = 0, now: int = NOW, map_entries: int = 1000, segment_bytes: int = 1 << 20,
              cleaning: int = 1) -> Outcome:
        job = Job("ns", "t", 0, 3, cleaning, tuple(self.segments), first_dirty, tuple(self.aborted), now, DAY,
                  segment_bytes, map_entries)
        outcome = clean(job, self.read, self.objects.__setitem__)
        for r in outcome.replacements:  # what the broker's commit does to the segment list
            i = self.segments.index(r.old[0])
            self.segments[i : i + len(r.old)] = [r.new]
        return outcome

    def rows(self) -> list[tuple[int, bytes | None, bytes | None, int]]:
        """Every data record left: (offset, key, value, timestamp)."""
        out = []
        for meta in self.segments:
            reader = SegmentReader(self.read(meta))
            for pos, h in reader.batches():
                if not h.is_control:
                    out += [(r.offset, r.key, r.value, r.timestamp) for r in decode(reader.batch_bytes(pos, h))]
        return out

    def batch_headers(self) -> list:
        return [h for meta in self.segments for _, h in SegmentReader(self.read(meta)).batches()]


def batch(*rows: Row, codec: int = 0, ts: int = NOW - DAY, pid: int = -1, transactional: bool = False) -> bytearray:
    spec = BatchSpec(codec, transactional, pid, 0 if pid >= 0 else -1, 0 if pid >= 0 else -1,
                     tuple(Record(ts + i, k, v, ()) for i, (k, v) in enumerate(rows)))
    return build_batch(spec)


def test_the_latest_value_of_every_key_stays_at_its_offset_with_its_timestamp() -> None:
    log = Log()
    log.segment(batch((b"a", b"a0"), (b"b", b"b0")), batch((b"c", b"c0"), codec=1))
    log.segment(batch((b"a", b"a1"), (b"b", b"b1"), codec=4))
    log.segment(batch((b"a", b"a2")))
    outcome = log.clean()
    assert log.rows() == [(2, b"c", b"c0", NOW - DAY), (4, b"b", b"b1", NOW - DAY + 1), (5, b"a", b"a2", NOW - DAY)]
    assert outcome.cleaned_to == 6
    assert outcome.stats.records_removed == 3
    # one segment now, spanning what the three did, written under this pass's key, its batches' offsets unchanged
    [meta] = log.segments
    assert (meta.base, meta.last, meta.records, meta.cleaned, meta.key_epoch) == (0, 5, 3, 1, 3)
    assert meta.stored("ns", "t", 0).key == "ns/t/0/segment-00000000000000000000-e3-c1.kfs"
    assert [(h.base_offset, h.last_offset, h.record_count, h.compression) for h in log.batch_headers()] == [
        (2, 2, 1, 1), (3, 4, 1, 4), (5, 5, 1, 0)]
    # nothing changed since: the next pass writes nothing
    assert log.clean(first_dirty=6, cleaning=2).replacements == ()


def test_a_tombstone_stays_for_delete_retention_after_the_cleaning_that_first_keeps_it() -> None:
    log = Log()
    log.segment(batch((b"a", b"a0"), (b"b", b"b0")))
    log.segment(batch((b"a", None)))
    log.clean()
    assert log.rows() == [(1, b"b", b"b0", NOW - DAY + 1), (2, b"a", None, NOW - DAY)]  # its timestamp kept
    [_, tombstone] = log.batch_headers()
    assert tombstone.delete_horizon_ms == NOW + DAY  # KIP-534: the horizon is the batch's base timestamp now
    log.clean(first_dirty=3, now=NOW + DAY - 1, cleaning=2)
    assert [r[0] for r in log.rows()] == [1, 2]  # not yet
    log.clean(first_dirty=3, now=NOW + DAY, cleaning=3)
    assert log.rows() == [(1, b"b", b"b0", NOW - DAY + 1)]


def test_aborted_records_go_and_their_marker_stays_until_its_horizon() -> None:
    log = Log()
    log.segment(batch((b"a", b"committed"), pid=7, transactional=True), batch((b"a", b"aborted"), pid=8,
                                                                              transactional=True))
    commit, abort = TxnMarker(7, 0, 0, True).batch(NOW - DAY), TxnMarker(8, 0, 0, False).batch(NOW - DAY)
    log.segment(commit, abort)
    log.aborted = [AbortedTxn(8, 1, 3)]
    log.segments[-1] = dataclasses.replace(log.segments[-1], aborted=(AbortedTxn(8, 1, 3),))
    log.clean()
    assert log.rows() == [(0, b"a", b"committed", NOW - DAY)]  # the aborted value never wins
    markers = [h for h in log.batch_headers() if h.is_control]
    # the pass saw a batch of each transaction: both markers stay as they are
    assert [(h.base_offset, h.delete_horizon_ms) for h in markers] == [(2, None), (3, None)]
    log.clean(first_dirty=4, cleaning=2)  # this pass sees nothing of the aborted one: its marker gets a horizon
    markers = [h for h in log.batch_headers() if h.is_control]
    assert [(h.base_offset, h.delete_horizon_ms) for h in markers] == [(2, None), (3, NOW + DAY)]
    assert log.segments[0].aborted == (AbortedTxn(8, 1, 3),)  # its marker is still there: so is its index entry
    log.clean(first_dirty=4, now=NOW + DAY, cleaning=3)
    assert [h.base_offset for h in log.batch_headers() if h.is_control] == [2]  # the commit's data is still here
    assert log.segments[0].aborted == ()


def test_a_key_map_too_small_for_the_dirty_part_cleans_it_in_passes() -> None:
    log = Log()
    for i in range(4):
        log.segment(batch((b"k%d" % i, b"v0"), (b"k%d" % (i + 1), b"v0")))
    log.segment(batch(*[(b"k%d" % i, b"v1") for i in range(5)]))
    first = log.clean(map_entries=3)
    assert first.cleaned_to == 4  # the first two batches' three keys filled it
    assert [r[0] for r in log.rows()] == [0, 2, 3, 4, 5, 6, 7, *range(8, 13)]  # offset 1's k1 was rewritten at 2
    second = log.clean(first_dirty=first.cleaned_to, map_entries=3, cleaning=2)
    third = log.clean(first_dirty=second.cleaned_to, map_entries=5, cleaning=3)
    assert third.cleaned_to == 13
    assert log.rows() == [(8 + i, b"k%d" % i, b"v1", NOW - DAY + i) for i in range(5)]


def test_records_without_a_key_are_dropped_and_a_full_segment_group_is_kept_apart() -> None:
    log = Log()
    log.segment(batch((None, b"no key"), (b"a", b"a0")))
    log.segment(batch((b"b", b"b0")))
    outcome = log.clean(segment_bytes=1)  # every segment is a group of its own
    assert log.rows() == [(1, b"a", b"a0", NOW - DAY + 1), (2, b"b", b"b0", NOW - DAY)]
    assert [len(r.old) for r in outcome.replacements] == [1]  # the second segment had nothing to drop
    assert [s.cleaned for s in log.segments] == [1, 0]


def test_a_batch_too_large_for_the_key_map_is_refused_with_a_message() -> None:
    log = Log()
    log.segment(batch((b"a", b"1"), (b"b", b"2")))
    with pytest.raises(ValueError, match="--compaction-map-entries 1 cannot hold the 2 keys"):
        log.clean(map_entries=1)


def test_a_group_with_nothing_left_keeps_its_span_as_one_emptied_batch() -> None:
    """No hole in the log (a reader takes a hole for lost data): the group's last batch stays, without records,
    neither compressed, nor transactional, nor a marker, so that a consumer's position moves past it."""
    log = Log()
    log.segment(batch((b"a", b"a0")))
    log.segment(batch((None, b"no key"), (b"a", b"a1"), codec=4, pid=5, transactional=True))
    log.segment(batch((b"a", b"a2")))
    log.clean(segment_bytes=1)  # every segment a group of its own
    assert [(s.base, s.last, s.records) for s in log.segments] == [(0, 0, 0), (1, 2, 0), (3, 3, 1)]
    emptied = log.batch_headers()[:2]
    assert [(h.base_offset, h.last_offset, h.record_count, h.compression, h.is_transactional, h.producer_id)
            for h in emptied] == [(0, 0, 0, 0, False, -1), (1, 2, 0, 0, False, 5)]
    assert log.rows() == [(3, b"a", b"a2", NOW - DAY)]


_KEYS = [None, b"", b"a", b"b", b"c" * 16, b"long key number one, past a digest", b"long key number two, past a digest"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.sampled_from(_KEYS), st.one_of(st.none(), st.binary(max_size=6)),
                                   st.booleans()), min_size=1, max_size=3),
                min_size=1, max_size=12),
       st.lists(st.sampled_from([0, 1, 2, 3, 4]), min_size=12, max_size=12),
       st.lists(st.integers(1, 4), min_size=12, max_size=12),
       st.integers(3, 8), st.integers(1, 4096))
def test_passes_keep_exactly_each_keys_latest_record_as_it_was_stored(
        batches: list[list[tuple[bytes | None, bytes | None, bool]]], codecs: list[int], per_segment: list[int],
        map_entries: int, segment_bytes: int) -> None:
    """Whatever the codecs, segments, key map size (so passes) and group size: once passes have covered the log,
    what is left is each key's latest record (a tombstone too, before its horizon), at its offset, with its
    timestamp and headers; nothing without a key."""
    log = Log()
    specs = [BatchSpec(codecs[i], False, -1, -1, -1,
                       tuple(Record(NOW - DAY + 10 * i + j, k, v, (("h", b"x"),) if header else ())
                             for j, (k, v, header) in enumerate(rows)))
             for i, rows in enumerate(batches)]
    expected: dict[bytes, tuple[int, bytes | None, int, tuple[tuple[str, bytes], ...]]] = {}
    offset, i = 0, 0
    for n in per_segment:
        chunk = specs[i : i + n]
        if not chunk:
            break
        for spec in chunk:
            for r in spec.records:
                if r.key is not None:
                    expected[r.key] = (offset, r.value, r.timestamp, r.headers)
                offset += 1
        log.segment(*[build_batch(spec) for spec in chunk])
        i += n
    if i < len(specs):
        log.segment(*[build_batch(spec) for spec in specs[i:]])
        for spec in specs[i:]:
            for r in spec.records:
                if r.key is not None:
                    expected[r.key] = (offset, r.value, r.timestamp, r.headers)
                offset += 1
    dirty, cleaning = 0, 1
    while dirty < offset:
        dirty = log.clean(first_dirty=dirty, map_entries=map_entries, segment_bytes=segment_bytes,
                          cleaning=cleaning).cleaned_to
        cleaning += 1
    left = []
    for meta in log.segments:
        reader = SegmentReader(log.read(meta))
        for pos, h in reader.batches():
            left += [(r.offset, r.key, r.value, r.timestamp, tuple(r.headers))
                     for r in decode(reader.batch_bytes(pos, h))]
    assert left == sorted((o, k, v, ts, hs) for k, (o, v, ts, hs) in expected.items())
