"""Kafka's legacy message format (magic 0 and 1): the message sets of Produce v0-v2 and Fetch v0-v3, read and
written as Apache Kafka reads and writes them. Nothing is stored in it: produce converts to v2 batches and fetch
converts back (kafscale/storage/legacy_convert.py); see docs/compatibility.md, "Old protocol versions".

A message set is a sequence of entries, each `offset i64, size i32` (the log overhead) and then `size` bytes:

    crc u32         CRC32 (not CRC32C) of everything after it
    magic i8        0 or 1
    attributes i8   bits 0-2 codec (0 none, 1 gzip, 2 snappy, 3 lz4); bit 3 (magic 1) LogAppendTime
    timestamp i64   magic 1 only
    key bytes       i32 length (-1: null), then the bytes
    value bytes     the same

A compressed entry (a "wrapper": codec != 0, null key) holds a whole inner message set, compressed, as its
value (kafscale/storage/legacy_codecs.py). Inner offsets are absolute for magic 0; for magic 1 they are relative
(0, 1, ...) and the wrapper's offset is the last inner message's absolute offset.

Errors are InvalidBatchError with Kafka's codes: damaged bytes are CORRUPT_MESSAGE (2), well-formed but wrong
messages INVALID_RECORD (87). Bytes that cannot be decompressed are CORRUPT_MESSAGE too (Kafka answers
UNKNOWN_SERVER_ERROR for them, an exception it did not expect).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from kafscale.storage.batch import CORRUPT_MESSAGE, INVALID_RECORD, Buffer, InvalidBatchError
from kafscale.storage.legacy_codecs import compress_legacy, decompress_legacy

__all__ = [
    "LOG_OVERHEAD",
    "Message",
    "Record",
    "inner_messages",
    "message_set",
    "read_message",
    "split_entries",
]

LOG_OVERHEAD = 12  # offset i64 + size i32
_HEADER_UP_TO_MAGIC = LOG_OVERHEAD + 5  # + crc + magic: enough to tell the format
_OVERHEAD = (14, 22)  # Kafka's RECORD_OVERHEAD_V0 / _V1: crc, magic, attributes, [timestamp], two lengths
_MAX_MAGIC = 2  # a Produce v0-v2 message set may carry v2 batches too (Kafka does not check the magic there)
CODEC_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08  # magic 1: LogAppendTime

_OFFSET_SIZE = struct.Struct(">qi")
_CRC_MAGIC_ATTRIBUTES = struct.Struct(">IBB")
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")


@dataclass(slots=True)
class Message:
    """One legacy message, as stored in its set: a plain message, or a wrapper (codec != 0)."""

    offset: int
    magic: int
    attributes: int
    timestamp: int  # -1 for magic 0
    key: bytes | None
    value: bytes | None
    crc_ok: bool
    size: int  # bytes, log overhead included

    @property
    def codec(self) -> int:
        return self.attributes & CODEC_MASK

    @property
    def log_append_time(self) -> bool:
        return self.magic > 0 and bool(self.attributes & TIMESTAMP_TYPE_BIT)


@dataclass(slots=True)
class Record:
    """What a message carries, whatever its format: the unit of conversion."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None


def split_entries(buf: Buffer, at: int = 0, end: int | None = None) -> Iterator[tuple[int, int, int]]:
    """(position, size with log overhead, magic) of each whole entry, as Kafka's ByteBufferLogInputStream reads
    them: a size below the smallest message or a magic above 2 is CORRUPT_MESSAGE; a partial entry at the end is
    left out without an error, as Kafka leaves it out."""
    end = len(buf) if end is None else end
    while end - at >= LOG_OVERHEAD:
        size = _I32.unpack_from(buf, at + 8)[0]
        if size < _OVERHEAD[0]:
            raise InvalidBatchError(f"message size {size} is less than the minimum message overhead "
                                    f"({_OVERHEAD[0]})", error_code=CORRUPT_MESSAGE, position=at)
        if end - at < _HEADER_UP_TO_MAGIC:
            return
        magic = buf[at + 16]
        if magic > _MAX_MAGIC:  # a byte: "negative" magics are above 127 here
            raise InvalidBatchError(f"invalid magic {magic - 256 if magic > 127 else magic} found in record",
                                    error_code=CORRUPT_MESSAGE, position=at)
        if end - at < LOG_OVERHEAD + size:
            return
        yield at, LOG_OVERHEAD + size, magic
        at += LOG_OVERHEAD + size


def read_message(buf: Buffer, at: int, size: int) -> Message:
    """The magic 0/1 message of `size` bytes (log overhead included) at `at`. Its CRC is checked (crc_ok), not
    enforced: Kafka checks a message's CRC at different steps depending on where it is, so the caller does."""
    offset = _I64.unpack_from(buf, at)[0]
    body, end = at + LOG_OVERHEAD, at + size
    crc, magic, attributes = _CRC_MAGIC_ATTRIBUTES.unpack_from(buf, body)
    crc_ok = zlib.crc32(memoryview(buf)[body + 4 : end]) == crc
    if magic > 1:  # not a legacy message (an inner one claiming magic 2): the caller refuses it by its magic
        return Message(offset, magic, attributes, -1, None, None, crc_ok, size)
    try:
        timestamp, key, value = _fields(buf, body + 6, end, magic)
    except InvalidBatchError as e:
        if not crc_ok:  # damaged bytes: the caller refuses them by their CRC, which Kafka checks first
            return Message(offset, magic, attributes, -1, None, None, crc_ok, size)
        raise InvalidBatchError(e.reason, error_code=e.error_code, position=at) from None
    return Message(offset, magic, attributes, timestamp, key, value, crc_ok, size)


def _fields(buf: Buffer, pos: int, end: int, magic: int) -> tuple[int, bytes | None, bytes | None]:
    timestamp = -1
    if magic == 1:
        if pos + 8 > end:
            raise _corrupt("message shorter than the magic 1 overhead", None)
        timestamp = _I64.unpack_from(buf, pos)[0]
        pos += 8
    key, pos = _bytes(buf, pos, end)
    value, pos = _bytes(buf, pos, end)
    # Bytes after the value are ignored, as Kafka's LegacyRecord ignores them (the CRC covers them).
    return timestamp, key, value


def _bytes(buf: Buffer, pos: int, end: int) -> tuple[bytes | None, int]:
    if pos + 4 > end:
        raise _corrupt("message truncated in a length", None)
    n = _I32.unpack_from(buf, pos)[0]
    pos += 4
    if n < 0:
        return None, pos
    if pos + n > end:
        raise _corrupt(f"message field of {n} bytes runs past the message's end", None)
    return bytes(buf[pos : pos + n]), pos + n


def _corrupt(reason: str, at: int | None) -> InvalidBatchError:
    return InvalidBatchError(reason, error_code=CORRUPT_MESSAGE, position=at)


def _invalid(reason: str, at: int | None = None) -> InvalidBatchError:
    return InvalidBatchError(reason, error_code=INVALID_RECORD, position=at)


def inner_messages(wrapper: Message) -> list[Message]:
    """The messages inside a wrapper, offsets made absolute, as Kafka's DeepRecordsIterator reads them: bytes
    that do not decompress, or an inner size below the minimum, are CORRUPT_MESSAGE; no inner message, a null
    value or a magic 1 wrapper offset below the last inner one (and not 0) are INVALID_RECORD. A partial inner
    message at the end is left out. CRCs of inner messages are not checked here (the caller does, in order)."""
    if wrapper.value is None:
        raise _invalid(f"compressed message set with a null value (magic {wrapper.magic})")
    try:
        data = decompress_legacy(wrapper.codec, wrapper.magic, wrapper.value)
    except Exception as e:  # cramjam's errors, ValueError, struct.error: these bytes are not that codec's
        raise _corrupt(f"compressed message set cannot be decompressed (codec {wrapper.codec}): {e}", 0) from None
    inner = []
    at = 0
    while len(data) - at >= LOG_OVERHEAD:
        size = _I32.unpack_from(data, at + 8)[0]
        if size < _OVERHEAD[0]:
            raise _corrupt(f"inner message size {size} is less than the minimum message overhead", at)
        if len(data) - at < LOG_OVERHEAD + size:
            break
        inner.append(read_message(data, at, LOG_OVERHEAD + size))
        at += LOG_OVERHEAD + size
    if not inner:
        raise _invalid("compressed message set with no inner messages")
    if wrapper.magic == 1:
        last = inner[-1].offset
        # librdkafka once wrote wrapper offset 0: Kafka takes that as base 0.
        if wrapper.offset != 0 and wrapper.offset < last:
            raise _invalid(f"wrapper offset {wrapper.offset} is less than the last inner message offset {last}")
        base = 0 if wrapper.offset == 0 else wrapper.offset - last
        for message in inner:
            message.offset += base
    return inner


def _write(out: bytearray, offset: int, magic: int, attributes: int, timestamp: int, key: bytes | None,
           value: Buffer | None) -> None:
    start = len(out)
    out += _OFFSET_SIZE.pack(offset, 0)
    out += b"\x00\x00\x00\x00"  # the CRC, filled in below
    out.append(magic)
    out.append(attributes)
    if magic == 1:
        out += _I64.pack(timestamp)
    for field in (key, value):
        if field is None:
            out += b"\xff\xff\xff\xff"
        else:
            out += _I32.pack(len(field))
            out += field
    _I32.pack_into(out, start + 8, len(out) - start - LOG_OVERHEAD)
    struct.pack_into(">I", out, start + LOG_OVERHEAD, zlib.crc32(memoryview(out)[start + 16 :]))


def message_set(magic: int, codec: int, records: list[Record], log_append_time: int | None = None) -> bytes:
    """`records` as Kafka's MemoryRecordsBuilder writes them in this magic: one message per record when
    uncompressed, else one wrapper around all of them. log_append_time: the batch's append time when it was
    LogAppendTime (magic 1 then says so, and uses it as the timestamp of plain messages and of the wrapper)."""
    append_time = log_append_time if magic == 1 else None  # magic 0 has no timestamps at all
    type_bit = TIMESTAMP_TYPE_BIT if append_time is not None else 0
    out = bytearray()
    if codec == 0:
        for r in records:
            stamp = r.timestamp if append_time is None else append_time
            _write(out, r.offset, magic, type_bit, stamp, r.key, r.value)
        return bytes(out)
    base = records[0].offset
    for r in records:
        # Magic 1 inner offsets are relative to the first record; magic 0 ones are absolute.
        _write(out, r.offset - base if magic == 1 else r.offset, magic, type_bit, r.timestamp, r.key, r.value)
    wrapper_time = max(r.timestamp for r in records) if append_time is None else append_time
    wrapped = bytearray()
    _write(wrapped, records[-1].offset, magic, codec | type_bit, wrapper_time, None,
           compress_legacy(codec, magic, out))
    return bytes(wrapped)
