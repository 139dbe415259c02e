"""The sparse segment index (``segment-….index``): offset → byte position, and timestamp → byte position.

Layout (big-endian, docs/format.md has the byte table):

    header   16 B  b"IDX\\0" · u16 version=1 · i32 entry count · i32 interval · u16 interval unit
    entries  12 B each: i64 offset · i32 position (from the start of the segment object; first is 32)
    time     b"TIM\\0" · u32 count (= entry count) · count × i64 max timestamp · u32 CRC32C

The seed layout is the header plus the entries; a reader that knows only that reads ``entry count``
entries and stops, so the time section after them does not disturb it. The trailing CRC32C covers the
whole object before it: a flipped position would otherwise send a reader to the wrong batch and skip
records without any error.
"""

from __future__ import annotations

import struct
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from crc32c import crc32c

from kafscale.storage.batch import BatchHeader, CorruptSegmentError

__all__ = [
    "INDEX_MAGIC",
    "TIME_MAGIC",
    "IndexEntry",
    "SegmentIndex",
    "build_index",
]

INDEX_MAGIC = b"IDX\x00"
TIME_MAGIC = b"TIM\x00"
INDEX_VERSION = 1
INDEX_HEADER_SIZE = 16
INDEX_ENTRY_SIZE = 12
TIME_HEADER_SIZE = 8
TIME_ENTRY_SIZE = 8
CRC_SIZE = 4
# Where the first batch of a segment starts (segment.SEGMENT_HEADER_SIZE; segment.py imports this
# module to build indexes, so the constant cannot come from there).
FIRST_BATCH_POSITION = 32

IntervalUnit = Literal["records", "bytes"]
# The seed's header field "Reserved" now says how to read "Interval". 0 keeps the seed's meaning
# ("messages between entries") so a seed-format reader interprets a records-interval index correctly.
_UNIT_CODES: dict[IntervalUnit, int] = {"records": 0, "bytes": 1}
_UNITS_BY_CODE: dict[int, IntervalUnit] = {code: unit for unit, code in _UNIT_CODES.items()}

_HEADER = struct.Struct(">4sHiiH")
_ENTRY = struct.Struct(">qi")
_TIME_HEADER = struct.Struct(">4sI")
_TIME_ENTRY = struct.Struct(">q")
_CRC = struct.Struct(">I")
_MAX_I32 = 2**31 - 1


@dataclass(frozen=True, slots=True)
class IndexEntry:
    offset: int
    position: int


@dataclass(frozen=True, slots=True)
class SegmentIndex:
    """Entries sorted by offset and position. ``max_timestamps[i]`` is the largest batch maxTimestamp
    from the start of the segment up to (not including) the batch of entry ``i + 1``: a running maximum,
    so it never decreases and the last value is the segment's maximum timestamp (-1 if none has one).
    """

    entries: list[IndexEntry]
    interval: int
    max_timestamps: list[int]
    interval_unit: IntervalUnit = "bytes"
    _offsets: list[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.entries:
            raise ValueError("an index has at least one entry")
        if len(self.max_timestamps) != len(self.entries):
            raise ValueError("one max timestamp per entry")
        object.__setattr__(self, "_offsets", [entry.offset for entry in self.entries])

    @classmethod
    def parse(cls, data: bytes | bytearray | memoryview, *, key: str | None = None) -> SegmentIndex:
        view = memoryview(data)
        size = len(view)

        def corrupt(reason: str, position: int) -> CorruptSegmentError:
            return CorruptSegmentError(f"segment index: {reason}", key=key, position=position)

        if size < INDEX_HEADER_SIZE:
            raise corrupt(f"truncated: {size} bytes, the header needs {INDEX_HEADER_SIZE}", size)
        magic, version, count, interval, unit_code = _HEADER.unpack_from(view, 0)
        if magic != INDEX_MAGIC:
            raise corrupt(f"bad magic {bytes(magic)!r}, expected {INDEX_MAGIC!r}", 0)
        if version != INDEX_VERSION:
            raise corrupt(f"unsupported version {version}", 4)
        if count < 1:
            raise corrupt(f"entry count {count}, at least 1 expected", 6)
        expected = _encoded_size(count)
        if size != expected:
            what = "truncated" if size < expected else "trailing bytes"
            raise corrupt(f"{what}: {size} bytes, {count} entries need {expected}", min(size, expected))
        # The CRC is checked before any field below is believed, so a damaged entry reports as damage
        # rather than as a confusing ordering error.
        crc_at = size - CRC_SIZE
        (stored_crc,) = _CRC.unpack_from(view, crc_at)
        actual_crc = crc32c(view[:crc_at])
        if stored_crc != actual_crc:
            raise corrupt(f"CRC32C mismatch: stored {stored_crc:#010x}, computed {actual_crc:#010x}", crc_at)
        unit = _UNITS_BY_CODE.get(unit_code)
        if unit is None:
            raise corrupt(f"unknown interval unit {unit_code}", 14)
        if interval < 1:
            raise corrupt(f"interval {interval} is not positive", 10)

        entries_end = INDEX_HEADER_SIZE + count * INDEX_ENTRY_SIZE
        entries = [IndexEntry(o, p) for o, p in _ENTRY.iter_unpack(view[INDEX_HEADER_SIZE:entries_end])]
        if entries[0].position != FIRST_BATCH_POSITION:
            raise corrupt(f"first entry at position {entries[0].position}", INDEX_HEADER_SIZE)
        for i in range(1, count):
            if entries[i].offset <= entries[i - 1].offset or entries[i].position <= entries[i - 1].position:
                raise corrupt(
                    f"entry {i} is not after entry {i - 1}", INDEX_HEADER_SIZE + i * INDEX_ENTRY_SIZE
                )

        time_magic, time_count = _TIME_HEADER.unpack_from(view, entries_end)
        if time_magic != TIME_MAGIC:
            raise corrupt(f"bad time-section magic {bytes(time_magic)!r}", entries_end)
        if time_count != count:
            raise corrupt(f"time section has {time_count} entries, offset section {count}", entries_end + 4)
        times_at = entries_end + TIME_HEADER_SIZE
        max_timestamps = [t for (t,) in _TIME_ENTRY.iter_unpack(view[times_at:crc_at])]
        for i in range(1, count):
            if max_timestamps[i] < max_timestamps[i - 1]:
                raise corrupt(f"time entry {i} decreases", times_at + i * TIME_ENTRY_SIZE)
        return cls(entries, interval, max_timestamps, unit)

    def entry_for(self, offset: int) -> IndexEntry:
        """The entry to start reading at for ``offset``: the greatest at or below it (else the first)."""
        i = bisect_right(self._offsets, offset) - 1
        return self.entries[max(i, 0)]

    def position_for(self, offset: int) -> int:
        """Where to start reading for ``offset`` (the position of ``entry_for(offset)``)."""
        return self.entry_for(offset).position

    def position_for_timestamp(self, timestamp_ms: int) -> int | None:
        """Where to start scanning for the first batch whose maxTimestamp >= ``timestamp_ms``.

        Every batch before the returned position has maxTimestamp < ``timestamp_ms``. None when no
        batch in the segment reaches the timestamp.
        """
        i = bisect_left(self.max_timestamps, timestamp_ms)
        if i == len(self.max_timestamps):
            return None
        return self.entries[i].position

    def encode(self) -> bytes:
        count = len(self.entries)
        flat = [value for entry in self.entries for value in (entry.offset, entry.position)]
        header = _HEADER.pack(
            INDEX_MAGIC, INDEX_VERSION, count, self.interval, _UNIT_CODES[self.interval_unit]
        )
        body = b"".join(
            (
                header,
                struct.pack(f">{'qi' * count}", *flat),
                _TIME_HEADER.pack(TIME_MAGIC, count),
                struct.pack(f">{count}q", *self.max_timestamps),
            )
        )
        return body + _CRC.pack(crc32c(body))


def build_index(
    batches: Iterable[tuple[int, BatchHeader]],
    *,
    interval_bytes: int = 4096,
    interval_records: int | None = None,
) -> SegmentIndex:
    """Sparse index over ``(object position, header)`` pairs in segment order.

    An entry at the first batch, then at the first batch that starts ``interval_bytes`` or more bytes
    after the previous entry's batch — or, when ``interval_records`` is given (it wins), at the first
    batch preceded by ``interval_records`` or more records since the previous entry.
    """
    unit: IntervalUnit = "bytes" if interval_records is None else "records"
    interval = interval_bytes if interval_records is None else interval_records
    if not 1 <= interval <= _MAX_I32:
        raise ValueError(f"index interval {interval} must be in 1..{_MAX_I32}")
    by_records = unit == "records"
    entries: list[IndexEntry] = []
    max_timestamps: list[int] = []
    running_max = -1
    entry_position = 0
    records_since = 0
    for position, header in batches:
        if not entries:
            entries.append(IndexEntry(header.base_offset, position))
            entry_position = position
        elif (records_since if by_records else position - entry_position) >= interval:
            # Close the previous entry's range before opening the next one.
            max_timestamps.append(running_max)
            entries.append(IndexEntry(header.base_offset, position))
            entry_position = position
            records_since = 0
        records_since += header.record_count
        running_max = max(running_max, header.max_timestamp)
    if not entries:
        raise ValueError("cannot index a segment without batches")
    max_timestamps.append(running_max)
    return SegmentIndex(entries, interval, max_timestamps, unit)


def _encoded_size(count: int) -> int:
    return (
        INDEX_HEADER_SIZE + count * INDEX_ENTRY_SIZE + TIME_HEADER_SIZE + count * TIME_ENTRY_SIZE + CRC_SIZE
    )
