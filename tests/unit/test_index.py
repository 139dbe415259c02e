"""The sparse segment index: lookups agree with a linear scan, and damage is always reported."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from kafscale.storage.batch import BatchHeader, CorruptSegmentError
from kafscale.storage.index import IndexEntry, SegmentIndex, build_index
from kafscale.storage.segment import SegmentReader, build_segment
from tests.strategies import contiguous_batches, no_deadline

KEY = "ns/orders/0/segment-00000000000000000000.index"


def synthetic(batches: list[tuple[int, int, int]], base: int = 0) -> list[tuple[int, BatchHeader]]:
    """(size, record count, max timestamp) triples laid out as a segment body from byte 32."""
    out = []
    position, offset = 32, base
    for size, count, max_ts in batches:
        header = BatchHeader(offset, size - 12, -1, 2, 0, 0, count - 1, max_ts, max_ts, -1, -1, -1, count)
        out.append((position, header))
        position += size
        offset += count
    return out


batch_shapes = st.lists(
    st.tuples(st.integers(61, 5_000), st.integers(1, 50), st.just(-1) | st.integers(0, 10_000)),
    min_size=1,
    max_size=60,
)
intervals = st.one_of(
    st.tuples(st.integers(1, 20_000), st.none()),
    st.tuples(st.just(4096), st.integers(1, 200)),
)


def expected_entry_positions(
    placed: list[tuple[int, BatchHeader]], by_bytes: int, by_records: int | None
) -> list[int]:
    chosen = [placed[0][0]]
    records = 0
    for position, header in placed:
        if position != chosen[0]:
            due = records >= by_records if by_records is not None else position - chosen[-1] >= by_bytes
            if due:
                chosen.append(position)
                records = 0
        records += header.record_count
    return chosen


@no_deadline
@given(batch_shapes, st.integers(0, 2**40), intervals)
def test_lookups_agree_with_a_linear_scan(
    shapes: list[tuple[int, int, int]], base: int, interval: tuple[int, int | None]
) -> None:
    placed = synthetic(shapes, base)
    index = build_index(placed, interval_bytes=interval[0], interval_records=interval[1])
    assert [e.position for e in index.entries] == expected_entry_positions(placed, *interval)
    assert all(any(e == IndexEntry(h.base_offset, p) for p, h in placed) for e in index.entries)

    last = placed[-1][1].last_offset
    for offset in [base - 1, *range(base, last + 1), last + 1]:
        below = [e.position for e in index.entries if e.offset <= offset]
        assert index.position_for(offset) == (below[-1] if below else index.entries[0].position)
        assert index.entry_for(offset).position == index.position_for(offset)  # what the ranged read starts at
        assert index.entry_for(offset).offset <= max(offset, index.entries[0].offset)

    stamps = sorted({h.max_timestamp for _, h in placed} | {-2, -1, 0, 10_001})
    for t in stamps + [s + 1 for s in stamps] + [s - 1 for s in stamps]:
        reaching = [p for p, h in placed if h.max_timestamp >= t]
        got = index.position_for_timestamp(t)
        if not reaching:
            assert got is None
            continue
        first = reaching[0]
        assert got == max(e.position for e in index.entries if e.position <= first)
        assert all(h.max_timestamp < t for p, h in placed if p < got)

    assert SegmentIndex.parse(index.encode()) == index


@no_deadline
@given(contiguous_batches(max_batches=10), st.integers(1, 600))
def test_index_of_a_built_segment(drawn: tuple[int, list, list[bytearray]], interval: int) -> None:
    _, _, batches = drawn
    built = build_segment(batches, created_ms=0, index_interval_bytes=interval)
    index = SegmentIndex.parse(built.index, key=KEY)
    reader = SegmentReader(built.data)
    placed = list(reader.batches())
    assert [e.position for e in index.entries] == expected_entry_positions(placed, interval, None)
    assert index.max_timestamps[-1] == reader.info.max_timestamp
    for position, header in placed:
        start = index.position_for(header.base_offset)
        # Scanning forward from the entry reaches the batch holding the offset.
        assert start <= position
        assert reader.slice_from(header.last_offset)[:8] == built.data[position : position + 8]


def test_seed_format_reader_sees_the_same_entries() -> None:
    """A reader of the seed layout reads the 16-byte header and `entry count` entries, nothing more."""
    placed = synthetic([(100, 1, 5), (5_000, 2, 9), (70, 1, 3), (4_500, 4, 20)])
    data = build_index(placed, interval_bytes=100).encode()
    magic, version, count, interval, _ = struct.unpack_from(">4sHiiH", data, 0)
    assert (magic, version, count, interval) == (b"IDX\x00", 1, 3, 100)
    seed_entries = [struct.unpack_from(">qi", data, 16 + 12 * i) for i in range(count)]
    assert seed_entries == [(0, 32), (1, 132), (3, 5_132)]


def test_time_section_layout() -> None:
    placed = synthetic([(100, 1, 5), (5_000, 2, -1), (70, 1, 3), (4_500, 4, 20)])
    data = build_index(placed, interval_bytes=100).encode()
    at = 16 + 3 * 12
    assert data[at : at + 8] == b"TIM\x00" + struct.pack(">I", 3)
    assert struct.unpack_from(">3q", data, at + 8) == (5, 5, 20)
    assert struct.unpack_from(">I", data, len(data) - 4) == (crc32c(data[:-4]),)
    assert len(data) == 16 + 3 * 12 + 8 + 3 * 8 + 4


def test_records_interval_is_recorded_with_its_unit() -> None:
    placed = synthetic([(100, 3, 1), (100, 3, 2), (100, 3, 3), (100, 3, 4)])
    index = build_index(placed, interval_records=5)
    assert [e.offset for e in index.entries] == [0, 6]
    data = index.encode()
    assert struct.unpack_from(">iH", data, 10) == (5, 0)  # unit 0 = records, the seed's meaning
    assert SegmentIndex.parse(data).interval_unit == "records"
    assert struct.unpack_from(">iH", build_index(placed, interval_bytes=150).encode(), 10) == (150, 1)


def test_no_timestamps_means_no_timestamp_position() -> None:
    index = build_index(synthetic([(100, 1, -1), (100, 1, -1)]), interval_bytes=1)
    assert index.position_for_timestamp(0) is None
    assert index.position_for_timestamp(-1) == 32


def test_bad_intervals_and_inputs_are_refused() -> None:
    placed = synthetic([(100, 1, 1)])
    for kwargs in ({"interval_bytes": 0}, {"interval_records": 0}, {"interval_bytes": 2**31}):
        with pytest.raises(ValueError):
            build_index(placed, **kwargs)
    with pytest.raises(ValueError):
        build_index([])
    with pytest.raises(ValueError):
        SegmentIndex([IndexEntry(0, 32)], 10, [])


def sample_index() -> bytes:
    placed = synthetic([(100, 1, 5), (5_000, 2, 9), (70, 1, 3), (4_500, 4, 20), (90, 1, 21)])
    return build_index(placed, interval_bytes=4_096).encode()


def assert_reported(data: bytes | bytearray) -> CorruptSegmentError:
    with pytest.raises(CorruptSegmentError) as info:
        SegmentIndex.parse(data, key=KEY)
    exc = info.value
    assert exc.error_code == 2
    assert exc.key == KEY and repr(KEY) in str(exc)
    assert exc.position is not None and 0 <= exc.position <= len(data)
    assert f"byte {exc.position}" in str(exc)
    return exc


def test_every_flipped_byte_is_reported() -> None:
    data = sample_index()
    for i in range(len(data)):
        for mask in (0x01, 0x80, 0xFF):
            damaged = bytearray(data)
            damaged[i] ^= mask
            assert_reported(damaged)


def test_every_truncation_and_trailing_bytes_are_reported() -> None:
    data = sample_index()
    for cut in range(len(data)):
        assert_reported(data[:cut])
    assert_reported(data + b"\x00")


def resealed(data: bytes, offset: int, fmt: str, *values: object) -> bytearray:
    """Edit a field and fix the CRC, to reach the checks that stand behind it."""
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, *values)
    struct.pack_into(">I", out, len(out) - 4, crc32c(bytes(out[:-4])))
    return out


@pytest.mark.parametrize(
    ("offset", "fmt", "values", "position", "words"),
    [
        pytest.param(0, ">4s", (b"IDX\x01",), 0, "magic", id="magic"),
        pytest.param(0, ">3s", (b"IDY",), 0, "magic", id="magic-3-bytes"),
        pytest.param(4, ">H", (2,), 4, "version", id="version"),
        pytest.param(14, ">H", (9,), 14, "unit", id="unit"),
        pytest.param(10, ">i", (0,), 10, "interval", id="interval"),
        pytest.param(16, ">qi", (0, 40), 16, "first entry", id="first-position"),
        pytest.param(28, ">q", (0,), 28, "not after", id="unsorted-offset"),
        pytest.param(36, ">i", (32,), 28, "not after", id="unsorted-position"),
        pytest.param(52, ">4s", (b"TIME",), 52, "time-section magic", id="time-magic"),
        pytest.param(56, ">I", (2,), 56, "time section", id="time-count"),
        pytest.param(68, ">q", (0,), 68, "decreases", id="time-decreasing"),
    ],
)
def test_checks_behind_the_crc(offset: int, fmt: str, values: tuple, position: int, words: str) -> None:
    exc = assert_reported(resealed(sample_index(), offset, fmt, *values))
    assert exc.position == position
    assert words in exc.reason


def test_bad_crc_names_its_position() -> None:
    data = bytearray(sample_index())
    data[-1] ^= 1
    assert assert_reported(data).position == len(data) - 4


def test_entry_count_that_does_not_fit_is_truncation() -> None:
    exc = assert_reported(resealed(sample_index(), 6, ">i", 1_000))
    assert "truncated" in exc.reason
    exc = assert_reported(resealed(sample_index(), 6, ">i", 0))
    assert exc.position == 6
