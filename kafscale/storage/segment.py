"""Segment objects (``segment-….kfs``): a 32-byte header, native Kafka v2 batches, a 16-byte footer.

Layout (big-endian, docs/format.md has the byte table):

    header  32 B  b"KAFS" · u16 version=1 · u16 flags · i64 base offset · i32 record count
                  · i64 created ms · u32 header CRC32C (the seed's "reserved")
    body          concatenated v2 record batches, exactly as produced apart from the patched base offsets
    footer  16 B  u32 CRC32C over all body bytes · i64 last offset · b"END!"

Keeping batches byte-identical means a fetch is a slice of the object: no re-encoding on either path.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from crc32c import crc32c

from kafscale.storage.batch import BatchHeader, Buffer, CorruptSegmentError, InvalidBatchError, split_batches
from kafscale.storage.index import FIRST_BATCH_POSITION, build_index

__all__ = [
    "FLAG_COMPACTED",
    "FLAG_HEADER_CRC",
    "SEGMENT_FOOTER_SIZE",
    "SEGMENT_HEADER_SIZE",
    "BuiltSegment",
    "CorruptSegmentError",
    "SegmentFooter",
    "SegmentHeader",
    "SegmentInfo",
    "SegmentReader",
    "batches_region",
    "build_segment",
    "parse_segment_footer",
    "parse_segment_header",
]

SEGMENT_MAGIC = b"KAFS"
FOOTER_MAGIC = b"END!"
SEGMENT_VERSION = 1
SEGMENT_HEADER_SIZE = 32
SEGMENT_FOOTER_SIZE = 16
# Flags bit 0: the last header field holds CRC32C of header bytes 0..27. Every segment we write sets
# it, so no header byte can flip unnoticed. Without it (the seed's and the Go Kafscale's layout) that
# field must be 0 and created-ms cannot be checked; such segments are still read.
FLAG_HEADER_CRC = 0x0001
# Flags bit 1: a compacted segment (kafscale.compaction). It covers offsets [header base, footer last] as the
# segments it replaced did, but its batches may leave gaps (removed records) anywhere in that range, and a batch
# may hold fewer records than its offset range (as Kafka's cleaned batches do).
FLAG_COMPACTED = 0x0002
_KNOWN_FLAGS = FLAG_HEADER_CRC | FLAG_COMPACTED
assert SEGMENT_HEADER_SIZE == FIRST_BATCH_POSITION

_HEADER_FIELDS = struct.Struct(">4sHHqiq")
_HEADER = struct.Struct(">4sHHqiqI")
_FOOTER = struct.Struct(">Iq4s")
assert _HEADER.size == SEGMENT_HEADER_SIZE and _FOOTER.size == SEGMENT_FOOTER_SIZE
_HEADER_CRC_AT = _HEADER_FIELDS.size
_RECORD_COUNT_AT = 16
_MAX_SIZE = 2**31 - 1  # index positions are i32


class SegmentHeader(NamedTuple):
    base_offset: int
    record_count: int
    created_ms: int
    compacted: bool = False  # FLAG_COMPACTED


class SegmentFooter(NamedTuple):
    crc: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    base_offset: int
    last_offset: int
    record_count: int
    batch_count: int
    size: int
    created_ms: int
    # Smallest and largest batch maxTimestamp, ignoring -1 (no timestamp); -1 when no batch has one.
    # Batch headers carry no lower bound for record timestamps, so min_timestamp is the smallest
    # batch-level timestamp, not the smallest record timestamp.
    min_timestamp: int
    max_timestamp: int
    crc: int


@dataclass(frozen=True, slots=True)
class BuiltSegment:
    data: bytes
    index: bytes
    info: SegmentInfo
    batches: list[tuple[int, BatchHeader]]  # (position in data, header) of every batch, in order


def batches_region(size: int) -> tuple[int, int]:
    """Byte range ``[start, end)`` of the batches in a segment object of ``size`` bytes."""
    if size < SEGMENT_HEADER_SIZE + SEGMENT_FOOTER_SIZE:
        raise ValueError(f"{size} bytes cannot hold a segment header and footer")
    return SEGMENT_HEADER_SIZE, size - SEGMENT_FOOTER_SIZE


def build_segment(
    batches: Sequence[Buffer],
    *,
    created_ms: int,
    index_interval_bytes: int = 4096,
    index_interval_records: int | None = None,
    span: tuple[int, int] | None = None,
) -> BuiltSegment:
    """Assemble a segment object and its index from batches that already carry their final offsets.

    Each element of ``batches`` holds one or more whole v2 batches (a produce request's records can be
    passed as they are). Offsets must be contiguous; CRCs are verified so that a batch damaged in
    memory is refused now rather than stored forever. ``span``: a compacted segment covering offsets
    [first, last], whose batches lie in that range in order, with gaps allowed.
    """
    if not batches:
        raise ValueError("a segment needs at least one batch")
    views = [memoryview(item) for item in batches]
    placed: list[tuple[int, BatchHeader]] = []
    position = SEGMENT_HEADER_SIZE
    body_crc = 0
    for view in views:
        for rel, header in split_batches(view, base_position=position):
            if span is not None:
                floor = placed[-1][1].last_offset + 1 if placed else span[0]
                if not floor <= header.base_offset <= header.last_offset <= span[1]:
                    raise ValueError(
                        f"batch at byte {position + rel} holds offsets {header.base_offset}..{header.last_offset},"
                        f" outside {floor}..{span[1]}"
                    )
            elif placed and header.base_offset != placed[-1][1].last_offset + 1:
                raise ValueError(
                    f"batch at byte {position + rel} starts at offset {header.base_offset},"
                    f" expected {placed[-1][1].last_offset + 1}"
                )
            placed.append((position + rel, header))
        body_crc = crc32c(view, body_crc)
        position += len(view)
    if not placed:
        raise ValueError("a segment needs at least one batch")
    size = position + SEGMENT_FOOTER_SIZE
    if size > _MAX_SIZE:
        raise ValueError(f"segment of {size} bytes exceeds the index's 32-bit positions")

    base_offset, last_offset = span if span is not None else (placed[0][1].base_offset, placed[-1][1].last_offset)
    if base_offset < 0:
        raise ValueError(f"negative base offset {base_offset}: offsets must be assigned before building")
    record_count = sum(header.record_count for _, header in placed)
    if record_count < 1 and span is None:
        raise ValueError("a segment needs at least one record")
    flags = FLAG_HEADER_CRC | (FLAG_COMPACTED if span is not None else 0)
    fields = _HEADER_FIELDS.pack(SEGMENT_MAGIC, SEGMENT_VERSION, flags, base_offset, record_count, created_ms)
    header_bytes = fields + crc32c(fields).to_bytes(4, "big")
    footer_bytes = _FOOTER.pack(body_crc, last_offset, FOOTER_MAGIC)
    data = b"".join([header_bytes, *views, footer_bytes])

    index = build_index(placed, interval_bytes=index_interval_bytes, interval_records=index_interval_records)
    min_ts, max_ts = _timestamp_range(placed)
    info = SegmentInfo(
        base_offset=base_offset,
        last_offset=last_offset,
        record_count=record_count,
        batch_count=len(placed),
        size=size,
        created_ms=created_ms,
        min_timestamp=min_ts,
        max_timestamp=max_ts,
        crc=body_crc,
    )
    return BuiltSegment(data=data, index=index.encode(), info=info, batches=placed)


def parse_segment_header(data: Buffer, key: str | None = None) -> SegmentHeader:
    """Parse and check the first 32 bytes of ``data`` (the whole object or a ranged GET of its start)."""
    if len(data) < SEGMENT_HEADER_SIZE:
        raise CorruptSegmentError(
            f"segment truncated: {len(data)} bytes, the header needs {SEGMENT_HEADER_SIZE}",
            key=key,
            position=len(data),
        )
    magic, version, flags, base_offset, record_count, created_ms, check = _HEADER.unpack_from(data, 0)
    if magic != SEGMENT_MAGIC:
        raise CorruptSegmentError(f"bad segment magic {bytes(magic)!r}", key=key, position=0)
    if flags & FLAG_HEADER_CRC:
        actual = crc32c(memoryview(data)[:_HEADER_CRC_AT])
        if actual != check:
            raise CorruptSegmentError(
                f"segment header CRC32C mismatch: stored {check:#010x}, computed {actual:#010x}",
                key=key,
                position=_HEADER_CRC_AT,
            )
    elif check != 0:
        # Seed-layout header: the field is reserved and must be zero.
        raise CorruptSegmentError(
            f"segment header reserved field is {check:#010x} without the header-CRC flag",
            key=key,
            position=_HEADER_CRC_AT,
        )
    if version != SEGMENT_VERSION:
        raise CorruptSegmentError(f"unsupported segment version {version}", key=key, position=4)
    if flags & ~_KNOWN_FLAGS:
        raise CorruptSegmentError(f"unknown segment flags {flags:#06x}", key=key, position=6)
    if base_offset < 0:
        raise CorruptSegmentError(f"negative segment base offset {base_offset}", key=key, position=8)
    if record_count < (0 if flags & FLAG_COMPACTED else 1):  # a cleaning may leave only emptied batches
        raise CorruptSegmentError(f"segment record count {record_count}", key=key, position=_RECORD_COUNT_AT)
    return SegmentHeader(base_offset, record_count, created_ms, bool(flags & FLAG_COMPACTED))


def parse_segment_footer(
    data: Buffer, key: str | None = None, *, object_size: int | None = None
) -> SegmentFooter:
    """Parse the last 16 bytes of ``data``: the whole object, or just its tail from a ranged GET (then
    pass ``object_size`` so errors report positions within the object)."""
    size = len(data)
    at = (size if object_size is None else object_size) - SEGMENT_FOOTER_SIZE
    if size < SEGMENT_FOOTER_SIZE:
        raise CorruptSegmentError(
            f"segment truncated: {size} bytes, the footer needs {SEGMENT_FOOTER_SIZE}", key=key, position=0
        )
    body_crc, last_offset, magic = _FOOTER.unpack_from(data, size - SEGMENT_FOOTER_SIZE)
    if magic != FOOTER_MAGIC:
        raise CorruptSegmentError(f"bad segment footer magic {bytes(magic)!r}", key=key, position=at + 12)
    return SegmentFooter(body_crc, last_offset)


class SegmentReader:
    """A validated view over one segment object.

    With ``verify`` (the default) every check runs: header, footer, each batch's structure and CRC,
    offset continuity, the counts against header and footer, and the footer CRC over all batch bytes
    (which also covers the batch fields Kafka's own CRC leaves out: base offset and leader epoch).
    ``verify=False`` keeps the structural checks and skips the CRCs, for bytes checked moments ago.
    """

    __slots__ = ("_ends", "_headers", "_offsets", "_positions", "_region_end", "_view", "info", "key")

    def __init__(self, data: Buffer, *, key: str | None = None, verify: bool = True) -> None:
        self.key = key
        view = memoryview(data)
        self._view = view
        size = len(view)
        if size < SEGMENT_HEADER_SIZE + SEGMENT_FOOTER_SIZE:
            raise CorruptSegmentError(
                f"segment truncated: {size} bytes, header and footer alone need"
                f" {SEGMENT_HEADER_SIZE + SEGMENT_FOOTER_SIZE}",
                key=key,
                position=size,
            )
        head = parse_segment_header(view, key)
        foot = parse_segment_footer(view, key)
        start, end = batches_region(size)
        self._region_end = end
        region = view[start:end]
        try:
            found = split_batches(region, verify_crc=verify, key=key, base_position=start)
        except InvalidBatchError as exc:
            raise CorruptSegmentError(f"segment batch: {exc.reason}", key=key, position=exc.position) from exc
        if not found:
            raise CorruptSegmentError("segment holds no batches", key=key, position=start)

        positions = [start + rel for rel, _ in found]
        headers = [header for _, header in found]
        expected = head.base_offset
        record_count = 0
        for position, header in zip(positions, headers, strict=True):
            if header.base_offset != expected and not (head.compacted and header.base_offset > expected):
                raise CorruptSegmentError(
                    f"batch starts at offset {header.base_offset}, expected {expected}",
                    key=key,
                    position=position,
                )
            expected = header.last_offset + 1
            record_count += header.record_count
        if record_count != head.record_count:
            raise CorruptSegmentError(
                f"segment header counts {head.record_count} records, batches hold {record_count}",
                key=key,
                position=_RECORD_COUNT_AT,
            )
        if headers[-1].last_offset != foot.last_offset and not (
                head.compacted and headers[-1].last_offset < foot.last_offset):
            raise CorruptSegmentError(
                f"footer last offset {foot.last_offset}, last batch ends at {headers[-1].last_offset}",
                key=key,
                position=end + 4,
            )
        if verify:
            actual = crc32c(region)
            if actual != foot.crc:
                raise CorruptSegmentError(
                    f"segment footer CRC32C mismatch over bytes {start}..{end}:"
                    f" stored {foot.crc:#010x}, computed {actual:#010x}",
                    key=key,
                    position=end,
                )

        self._positions = positions
        self._headers = headers
        self._offsets = [header.base_offset for header in headers]
        self._ends = [p + h.size for p, h in zip(positions, headers, strict=True)]
        min_ts, max_ts = _timestamp_range(found)
        self.info = SegmentInfo(
            base_offset=head.base_offset,
            last_offset=foot.last_offset,
            record_count=record_count,
            batch_count=len(headers),
            size=size,
            created_ms=head.created_ms,
            min_timestamp=min_ts,
            max_timestamp=max_ts,
            crc=foot.crc,
        )

    def batches(self) -> Iterator[tuple[int, BatchHeader]]:
        """``(position in the object, header)`` for every batch, in offset order."""
        return zip(self._positions, self._headers, strict=True)

    def batch_bytes(self, position: int, header: BatchHeader) -> memoryview:
        return self._view[position : position + header.size]

    def slice_from(self, offset: int, max_bytes: int | None = None) -> memoryview:
        """Whole batches from the one containing ``offset`` (or, in a compacted segment's gap, the next one), up
        to ``max_bytes`` but never fewer than one batch (Kafka returns an oversized first batch whole so that a
        consumer can make progress). Empty when the segment holds nothing at or after ``offset``."""
        if not self.info.base_offset <= offset <= self.info.last_offset:
            raise ValueError(
                f"offset {offset} outside segment {self.info.base_offset}..{self.info.last_offset}"
                f" ({self.key})"
            )
        first = max(bisect_right(self._offsets, offset) - 1, 0)
        if self._headers[first].last_offset < offset:  # in a gap a cleaning left: the next batch
            first += 1
        if first == len(self._headers):
            return self._view[self._region_end : self._region_end]
        start = self._positions[first]
        if max_bytes is None:
            return self._view[start : self._region_end]
        last = max(first, bisect_right(self._ends, start + max_bytes) - 1)
        return self._view[start : self._ends[last]]


def _timestamp_range(batches: Sequence[tuple[int, BatchHeader]]) -> tuple[int, int]:
    stamps = [header.max_timestamp for _, header in batches if header.max_timestamp != -1]
    if not stamps:
        return -1, -1
    return min(stamps), max(stamps)
