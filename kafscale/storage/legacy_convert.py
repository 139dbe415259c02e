"""Legacy message sets (magic 0 and 1) to v2 record batches and back, as Apache Kafka 3.9 converts them.

Kafscale stores v2 batches only. An old producer's message set (Produce v0-v2) is converted on the way in, the way
Kafka's LogValidator converts it for a log of message format v2 (every Kafka 3.x log): the messages become one v2
batch, compressed with the wrapper's codec if they came compressed; magic 0 messages have no timestamp and keep
none (-1, CreateTime), magic 1 ones keep theirs. An old consumer's fetch (Fetch v0-v3) gets the stored batches
converted back, one batch at a time, as Kafka's lazy down-conversion (KIP-283) does, and sized as Kafka sizes it.

Neither runs for current clients: Produce v3+ and Fetch v4+ never get here.
"""

from __future__ import annotations

import struct

from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from kafscale.storage.batch import CORRUPT_MESSAGE, INVALID_RECORD, Buffer, InvalidBatchError, check_crc, read_header
from kafscale.storage.codecs import CODEC_ZSTD
from kafscale.storage.legacy import Message, Record, inner_messages, message_set, read_message, split_entries

__all__ = ["INVALID_TIMESTAMP", "MESSAGE_TOO_LARGE", "UnsupportedCodec", "down_convert", "fit", "up_convert"]

INVALID_TIMESTAMP = 32
MESSAGE_TOO_LARGE = 10
_MAX_BATCH = 2**31 - 1
_OVERFLOW_CHUNK = 16 * 1024  # LazyDownConversionRecordsSend.MAX_READ_SIZE
_MIN_BATCH = 61  # DefaultRecordBatch.RECORD_BATCH_OVERHEAD
_OVERFLOW_HEAD = struct.Struct(">qi")


class UnsupportedCodec(Exception):
    """A zstd batch where an old consumer asked for messages: Kafka answers UNSUPPORTED_COMPRESSION_TYPE."""


# ------------------------------------------------------------------------------------------------ produce


def up_convert(buf: Buffer, *, log_append_time: bool = False, max_message_bytes: int | None = None) -> bytes:
    """A Produce v0-v2 partition's records as the v2 batch that Kafka would append (b"" when there is no whole
    entry: Kafka appends nothing and answers success with base offset -1). A set of v2 batches (Kafka does not
    check the magic below Produce v3) passes through as it is. Raises InvalidBatchError with Kafka's code.

    log_append_time: the topic's message.timestamp.type is LogAppendTime (a producer may not claim it then).
    max_message_bytes: the topic's max.message.bytes, checked per entry as Kafka checks it before converting."""
    entries: list[tuple[int, int, int, Message | None]] = []
    codec = 0
    # UnifiedLog.analyzeAndValidateRecords: per entry, its size, then its CRC; the codec of the last compressed
    # one is the set's.
    for at, size, magic in split_entries(buf):
        if max_message_bytes is not None and size > max_message_bytes:
            raise InvalidBatchError(f"message of {size} bytes exceeds max.message.bytes ({max_message_bytes})",
                                    error_code=MESSAGE_TOO_LARGE, position=at)
        message = None
        if magic == 2:
            header = read_header(buf, at)
            check_crc(buf, at, header)
            entry_codec = header.compression
        else:
            message = read_message(buf, at, size)
            if not message.crc_ok:
                raise InvalidBatchError("message is corrupt (CRC32)", error_code=CORRUPT_MESSAGE, position=at)
            entry_codec = message.codec
        codec = entry_codec or codec
        entries.append((at, size, magic, message))
    if not entries:
        return b""
    first_magic = entries[0][2]
    # LogValidator: v2, or compressed, means exactly one batch.
    if (first_magic == 2 or codec) and len(entries) > 1:
        raise _invalid("compressed outer message set (or v2 batch) is followed by more entries")
    if first_magic == 2:
        at, size, _, _ = entries[0]
        return bytes(buf[at : at + size])  # the partition owner checks it as it checks Produce v3+ batches
    if codec:
        wrapper = entries[0][3]
        assert wrapper is not None
        return _build(_deep_records(wrapper, log_append_time), codec)
    records = []
    for i, (at, _, magic, message) in enumerate(entries):
        if magic != first_magic or message is None:
            raise _invalid(f"message magic {magic} is not the first message's magic {first_magic}", at)
        # Each plain message is a batch of its own to Kafka: its checks end with it.
        if _claims_log_append_time(message.timestamp, message.log_append_time, log_append_time):
            raise _log_append_time_claimed()
        _check_negative(message.timestamp)
        records.append(Record(i, message.timestamp, message.key, message.value))
    return _build(records, 0)


def _deep_records(wrapper: Message, log_append_time: bool) -> list[Record]:
    """The records of a compressed wrapper, checked in LogValidator's order: nested compression and a damaged
    inner message at once; a wrong magic or a wrongly claimed LogAppendTime after all of them (INVALID_TIMESTAMP
    first); then the v2 builder's refusal of negative timestamps."""
    if wrapper.codec >= CODEC_ZSTD:  # zstd never existed in the legacy format; 5-7 are no codec at all
        raise _invalid(f"codec {wrapper.codec} in a magic {wrapper.magic} message")
    records = []
    wrong_magic = wrong_claim = False
    for i, message in enumerate(inner_messages(wrapper)):
        if message.codec:
            raise _invalid("inner messages must not be compressed")
        if message.magic != wrapper.magic:
            wrong_magic = True
            continue
        if not message.crc_ok:
            raise InvalidBatchError("inner message is corrupt (CRC32)", error_code=CORRUPT_MESSAGE)
        timestamp = message.timestamp
        if message.magic == 1 and wrapper.log_append_time:
            timestamp = wrapper.timestamp  # a LogAppendTime wrapper's time is every inner message's
        wrong_claim |= _claims_log_append_time(timestamp, wrapper.log_append_time, log_append_time)
        records.append(Record(i, timestamp, message.key, message.value))
    if wrong_claim:
        raise _log_append_time_claimed()
    if wrong_magic:
        raise _invalid(f"an inner message's magic does not match the wrapper's ({wrapper.magic})")
    for r in records:
        _check_negative(r.timestamp)
    return records


def _claims_log_append_time(timestamp: int, claims: bool, topic_log_append_time: bool) -> bool:
    """LogValidator.validateTimestamp: a producer may claim LogAppendTime only for a timestamp of its own on a
    CreateTime topic (which keeps it as CreateTime). There are no timestamp bounds: Kafscale has none for any
    batch (docs/format.md)."""
    return claims and (topic_log_append_time or timestamp == -1)


def _log_append_time_claimed() -> InvalidBatchError:
    return InvalidBatchError("producers may not set the timestamp type to LogAppendTime",
                             error_code=INVALID_TIMESTAMP)


def _check_negative(timestamp: int) -> None:
    """Kafka's v2 builder refuses negative timestamps other than -1 (with an exception it did not expect,
    UNKNOWN_SERVER_ERROR; here INVALID_TIMESTAMP, docs/compatibility.md)."""
    if timestamp < -1:
        raise InvalidBatchError(f"invalid negative timestamp {timestamp}", error_code=INVALID_TIMESTAMP)


def _build(records: list[Record], codec: int) -> bytes:
    """One v2 batch of records, offsets 0.. (the owner assigns the real ones), no producer id."""
    builder = DefaultRecordBatchBuilder(2, codec, 0, -1, -1, -1, _MAX_BATCH)
    for i, r in enumerate(records):
        builder.append(i, timestamp=r.timestamp, key=r.key, value=r.value, headers=[])
    return bytes(builder.build())


def _invalid(reason: str, at: int | None = None) -> InvalidBatchError:
    return InvalidBatchError(reason, error_code=INVALID_RECORD, position=at)


# ------------------------------------------------------------------------------------------------ fetch


def down_convert(batches: Buffer, magic: int, fetch_offset: int) -> tuple[list[bytes], int]:
    """The stored v2 batches (whole ones, as the read path returns them) as magic 0 or 1 message sets: one
    converted chunk per batch that converts to anything, and the bytes of v2 input they came from.

    As Kafka's RecordsUtil.downConvert: control batches are left out; an uncompressed batch loses its records
    below fetch_offset (old consumers expect the first message at the offset they asked for), a compressed one
    keeps them all (it goes whole, in one wrapper); headers are dropped; magic 0 drops timestamps too. A zstd
    batch cannot be converted: UnsupportedCodec if it is the first, else the conversion stops before it."""
    chunks: list[bytes] = []
    view = memoryview(batches)
    at = 0
    while at < len(view):
        header = read_header(view, at)
        end = at + header.size
        if header.compression == CODEC_ZSTD:
            if not chunks:
                raise UnsupportedCodec("zstd batches cannot be converted to the legacy message format")
            break
        if not header.is_control:
            chunk = _convert_batch(view[at:end], header.compression, magic, fetch_offset)
            if chunk:
                chunks.append(chunk)
        at = end
    return chunks, at


def _convert_batch(raw: memoryview, codec: int, magic: int, fetch_offset: int) -> bytes:
    batch = DefaultRecordBatch(bytes(raw))
    append_time = batch.max_timestamp if batch.timestamp_type == 1 else None
    records = [Record(r.offset, r.timestamp, r.key, r.value) for r in batch
               if codec or r.offset >= fetch_offset]
    if not records:
        return b""
    return message_set(magic, codec, records, append_time)


def fit(chunks: list[bytes], input_size: int) -> bytes:
    """The partition's records field as Kafka sends it for a down-converted fetch: it promised a size up front,
    max(v2 input bytes, first converted chunk), and keeps to it: converted messages beyond it are cut (a partial
    message at the end, which old consumers skip), and a shortfall is filled with "overflow" entries (offset -1
    and a size past the end, which they skip too). Nothing converted: empty."""
    if not chunks:
        return b""
    size = max(input_size, len(chunks[0]))
    out = bytearray()
    for chunk in chunks:
        out += chunk[: size - len(out)]
        if len(out) >= size:
            return bytes(out)
    while len(out) < size:  # LazyDownConversionRecordsSend.buildOverflowBatch, as often as it takes
        remaining = size - len(out)
        block = bytearray(max(12, min(remaining + 1, _OVERFLOW_CHUNK)))
        _OVERFLOW_HEAD.pack_into(block, 0, -1, max(remaining + 1, _MIN_BATCH))
        out += block[:remaining]
    return bytes(out)
