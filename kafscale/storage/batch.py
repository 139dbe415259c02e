"""Kafka v2 record batch header: parse, validate, and patch in place.

The broker treats a record batch as opaque bytes. It needs only the 61-byte header (offsets, counts,
timestamps, flags), the CRC32C over bytes 21..end, and two in-place patches: the base offset (outside
the CRC, so the CRC stays valid) and LogAppendTime (inside it, so the CRC is recomputed). Everything
here works on memoryviews with ``struct.unpack_from``: no per-record work and no copy of a batch body.

Error codes follow Kafka's broker: damage to the bytes (CRC mismatch, truncation, a length or magic
that cannot be right) is CorruptRecordException = CORRUPT_MESSAGE (2); a well-formed batch whose fields
contradict each other is InvalidRecordException = INVALID_RECORD (87). See docs/format.md.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from typing import Any

from crc32c import crc32c

__all__ = [
    "ATTRIBUTES_OFFSET",
    "BATCH_LENGTH_OFFSET",
    "CORRUPT_MESSAGE",
    "CRC_OFFSET",
    "HEADER_SIZE",
    "INVALID_RECORD",
    "LOG_OVERHEAD",
    "MAGIC_OFFSET",
    "MAX_TIMESTAMP_OFFSET",
    "PRODUCER_ID_OFFSET",
    "RECORD_COUNT_OFFSET",
    "BatchHeader",
    "CorruptSegmentError",
    "InvalidBatchError",
    "batch_size",
    "check_crc",
    "client_batch_problem",
    "count_records",
    "read_header",
    "set_base_offset",
    "set_log_append_time",
    "split_batches",
]

Buffer = bytes | bytearray | memoryview

HEADER_SIZE = 61
# baseOffset + batchLength: the part of a batch that batchLength does not count.
LOG_OVERHEAD = 12
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD
BATCH_LENGTH_OFFSET = 8
MAGIC_OFFSET = 16
CRC_OFFSET = 17
# The CRC covers everything from the attributes to the end, which is why baseOffset, batchLength and
# partitionLeaderEpoch can be rewritten without recomputing it.
ATTRIBUTES_OFFSET = 21
MAX_TIMESTAMP_OFFSET = 35
PRODUCER_ID_OFFSET = 43
RECORD_COUNT_OFFSET = 57  # the header's last field
MAGIC_V2 = 2

CORRUPT_MESSAGE = 2
INVALID_RECORD = 87

CODEC_MASK = 0x07
MAX_CODEC = 4  # zstd
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
# KIP-534: set by a log cleaner on a batch holding tombstones or a marker it keeps for now; the batch's
# baseTimestamp is then the time after which the cleaner may remove them (its records' deltas stay relative).
DELETE_HORIZON_BIT = 0x40

_HEADER = struct.Struct(">qiibIhiqqqhii")
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I16 = struct.Struct(">h")
_I8 = struct.Struct(">b")
assert _HEADER.size == HEADER_SIZE
assert _HEADER.size == RECORD_COUNT_OFFSET + 4


class InvalidBatchError(Exception):
    """A record batch (or a stored object holding batches) failed validation.

    ``error_code`` is the Kafka error code the broker answers with; ``key`` names the object the bytes
    came from (None for a produce request) and ``position`` the byte where the offending batch or field
    starts, counted from the start of the buffer or object.
    """

    def __init__(
        self,
        reason: str,
        *,
        error_code: int = CORRUPT_MESSAGE,
        key: str | None = None,
        position: int | None = None,
    ) -> None:
        self.reason = reason
        self.error_code = error_code
        self.key = key
        self.position = position
        where = []
        if key is not None:
            where.append(f"object {key!r}")
        if position is not None:
            where.append(f"byte {position}")
        super().__init__(f"{reason} ({', '.join(where)})" if where else reason)

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        # Errors cross Ray process boundaries by pickling; the default reduce would call __init__ with
        # the formatted message only and lose the keyword-only fields.
        return (
            functools.partial(
                type(self), self.reason, error_code=self.error_code, key=self.key, position=self.position
            ),
            (),
        )


class CorruptSegmentError(InvalidBatchError):
    """A segment or index object is damaged. Always CORRUPT_MESSAGE: the bytes, not the client, are wrong.

    Defined here rather than in segment.py because index.py raises it too and segment.py imports
    index.py; segment.py re-exports it.
    """


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Bytes of the whole batch, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def compression(self) -> int:
        """0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd."""
        return self.attributes & CODEC_MASK

    @property
    def timestamp_type(self) -> int:
        """0 CreateTime, 1 LogAppendTime."""
        return (self.attributes & TIMESTAMP_TYPE_BIT) >> 3

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)

    @property
    def delete_horizon_ms(self) -> int | None:
        """KIP-534's delete horizon a cleaner stamped on the batch, or None."""
        return self.first_timestamp if self.attributes & DELETE_HORIZON_BIT else None


def read_header(buf: Buffer, pos: int = 0, *, key: str | None = None) -> BatchHeader:
    """Parse and structurally validate the batch starting at ``pos``; the CRC is not checked here.

    Requires the whole batch (not just its header) to lie inside ``buf``.
    """
    return _read_header(buf, pos, key, 0)


def check_crc(buf: Buffer, pos: int, header: BatchHeader, *, key: str | None = None) -> None:
    """Raise InvalidBatchError (CORRUPT_MESSAGE) unless the batch's stored CRC32C matches its bytes."""
    _check_crc(memoryview(buf), pos, header, key, 0)


def batch_size(buf: Buffer, pos: int = 0) -> int:
    """Bytes of the whole batch starting at ``pos`` (batchLength + LOG_OVERHEAD), from its length field
    alone: nothing is validated, and only bytes up to ``pos + LOG_OVERHEAD`` need to be present."""
    return _I32.unpack_from(buf, pos + BATCH_LENGTH_OFFSET)[0] + LOG_OVERHEAD


def count_records(buf: Buffer) -> int:
    """Records in concatenated batches that were validated already, from their headers alone."""
    n, pos, end = 0, 0, len(buf)
    while pos + HEADER_SIZE <= end:
        n += _I32.unpack_from(buf, pos + RECORD_COUNT_OFFSET)[0]
        pos += batch_size(buf, pos)
    return n


def split_batches(
    buf: Buffer, *, verify_crc: bool = True, key: str | None = None, base_position: int = 0
) -> list[tuple[int, BatchHeader]]:
    """Walk the concatenated batches in ``buf``: ``[(position in buf, header), ...]``.

    The buffer must be consumed exactly: a trailing partial batch is an error (Kafka's own log reader
    silently drops one, but here a partial batch means a short read or a damaged object). An empty
    buffer yields an empty list; whether that is acceptable is the caller's decision. ``base_position``
    is added to positions reported in errors (e.g. the object position of a ranged GET), not to the
    returned positions.
    """
    view = memoryview(buf)
    end = len(view)
    pos = 0
    out: list[tuple[int, BatchHeader]] = []
    while pos < end:
        header = _read_header(view, pos, key, base_position)
        if verify_crc:
            _check_crc(view, pos, header, key, base_position)
        out.append((pos, header))
        pos += header.batch_length + LOG_OVERHEAD
    return out


def client_batch_problem(header: BatchHeader) -> str | None:
    """Kafka's rule for batches a producer sends (LogValidator.validateBatch): one record per offset of the
    batch's range. Stored batches may hold fewer once compacted."""
    if header.record_count != header.last_offset_delta + 1:
        return (f"record batch offset range covers {header.last_offset_delta + 1} offsets"
                f" but declares {header.record_count} records")
    return None


def set_base_offset(buf: bytearray | memoryview, pos: int, base_offset: int) -> None:
    """Rewrite the base offset in place; the CRC does not cover it, so the batch stays valid."""
    _I64.pack_into(buf, pos, base_offset)


def set_log_append_time(buf: bytearray | memoryview, pos: int, timestamp_ms: int) -> None:
    """Mark the batch LogAppendTime with ``timestamp_ms`` and recompute its CRC, as Kafka does.

    Kafka (DefaultRecordBatch.setMaxTimestamp) sets the timestamp-type bit and maxTimestamp only;
    baseTimestamp and the per-record deltas stay as produced, because readers of a LogAppendTime batch
    take every record's timestamp from maxTimestamp. We do the same.

    The new CRC is computed over the current bytes, so it would seal in any damage already present:
    verify the CRC first (``split_batches`` does by default).
    """
    view = memoryview(buf)
    header = _read_header(view, pos, None, 0)
    attributes = header.attributes | TIMESTAMP_TYPE_BIT
    if attributes == header.attributes and header.max_timestamp == timestamp_ms:
        return
    _I16.pack_into(view, pos + ATTRIBUTES_OFFSET, attributes)
    _I64.pack_into(view, pos + MAX_TIMESTAMP_OFFSET, timestamp_ms)
    crc = crc32c(view[pos + ATTRIBUTES_OFFSET : pos + header.size])
    _U32.pack_into(view, pos + CRC_OFFSET, crc)


def _read_header(buf: Buffer, pos: int, key: str | None, base: int) -> BatchHeader:
    available = len(buf) - pos
    where = base + pos
    # Magic first: v0/v1 message sets keep magic at the same byte but have a shorter, different header,
    # so nothing else can be interpreted until we know it is v2.
    if available > MAGIC_OFFSET:
        (magic,) = _I8.unpack_from(buf, pos + MAGIC_OFFSET)
        if magic != MAGIC_V2:
            if magic in (0, 1):
                # Kafka's ProduceRequest v3+ rejects legacy batches with InvalidRecordException; older
                # request versions must be up-converted by the caller before they reach this parser.
                raise InvalidBatchError(
                    f"legacy message format (magic {magic}) where a v2 record batch is required",
                    error_code=INVALID_RECORD,
                    key=key,
                    position=where,
                )
            raise InvalidBatchError(f"invalid magic {magic} in record batch", key=key, position=where)
    if available < HEADER_SIZE:
        raise InvalidBatchError(
            f"truncated record batch: {available} bytes left, a v2 batch header needs {HEADER_SIZE}",
            key=key,
            position=where,
        )
    header = BatchHeader(*_HEADER.unpack_from(buf, pos))
    if header.batch_length < MIN_BATCH_LENGTH:
        raise InvalidBatchError(
            f"record batch length {header.batch_length} is below the minimum {MIN_BATCH_LENGTH}",
            key=key,
            position=where,
        )
    if header.batch_length + LOG_OVERHEAD > available:
        raise InvalidBatchError(
            f"truncated record batch: declares {header.batch_length + LOG_OVERHEAD} bytes,"
            f" {available} bytes left",
            key=key,
            position=where,
        )
    # Compaction leaves stored batches with fewer records than their offset range, even none (Kafka's
    # cleaner does the same), so only what no batch may ever hold is refused here; the produce path adds
    # the client rule (`client_batch_problem`).
    if header.last_offset_delta < 0:
        raise InvalidBatchError(
            f"record batch has a negative last offset delta {header.last_offset_delta}",
            error_code=INVALID_RECORD,
            key=key,
            position=where,
        )
    if not 0 <= header.record_count <= header.last_offset_delta + 1:
        raise InvalidBatchError(
            f"record batch offset range covers {header.last_offset_delta + 1} offsets"
            f" but declares {header.record_count} records",
            error_code=INVALID_RECORD,
            key=key,
            position=where,
        )
    if header.attributes & CODEC_MASK > MAX_CODEC:
        # Kafka fails here with an unhandled IllegalArgumentException (UNKNOWN_SERVER_ERROR); a batch
        # naming a codec that does not exist is an invalid record, so we say so.
        raise InvalidBatchError(
            f"record batch names unknown compression codec {header.attributes & CODEC_MASK}",
            error_code=INVALID_RECORD,
            key=key,
            position=where,
        )
    return header


def _check_crc(view: memoryview, pos: int, header: BatchHeader, key: str | None, base: int) -> None:
    actual = crc32c(view[pos + ATTRIBUTES_OFFSET : pos + header.batch_length + LOG_OVERHEAD])
    if actual != header.crc:
        raise InvalidBatchError(
            f"record batch CRC32C mismatch: stored {header.crc:#010x}, computed {actual:#010x}",
            key=key,
            position=base + pos,
        )
