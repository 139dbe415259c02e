"""Record decoding for the pipeline: stored v2 record batches → one Arrow RecordBatch in Spark's Kafka schema.

Why not aiokafka's DefaultRecordBatch record by record: it builds a Python object per record and a bytes
object per key, value and header, which tops out near 0.6 M records/s once the values are moved into
Arrow. Here the only per-record Python work is walking the record lengths (records are chained by their
varint length prefix, so finding where each starts is inherently sequential); every field is then
decoded for all records at once with numpy, and keys and values become Arrow binary *views* over the
decompressed bytes, which Arrow's C++ cast turns into plain binary arrays.

The caller has checked the batches (CRC, structure, offsets: ``split_batches`` / ``SegmentReader``); the
checks here are the ones those cannot make, that the records inside a batch are well formed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from kafscale.storage.batch import HEADER_SIZE, BatchHeader, Buffer, CorruptSegmentError
from kafscale.storage.codecs import decompress

__all__ = ["KAFKA_ARROW_SCHEMA", "decode_batches", "decompress", "empty_batch"]

_HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
# Exactly what pyspark's to_arrow_schema() makes of Spark's Kafka source schema (timestamps in UTC):
# Spark refuses Arrow batches whose schema differs in any way.
_HEADERS_TYPE = pa.list_(pa.field("element", _HEADER_TYPE))
KAFKA_ARROW_SCHEMA = pa.schema([
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("timestampType", pa.int32()),
    pa.field("headers", _HEADERS_TYPE),
])

_PAD = 16  # zero bytes after the records, so that vectorised varint reads never index past the end
_INLINE = 12  # Arrow binary views keep values up to 12 bytes inside the view itself


def empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=KAFKA_ARROW_SCHEMA)


def decode_batches(
    batches: Sequence[tuple[Buffer, BatchHeader]],
    topic: str,
    partition: int,
    *,
    start_offset: int = 0,
    end_offset: int | None = None,
    key: str | None = None,
) -> pa.RecordBatch:
    """Every data record of ``batches`` (whole v2 batches, CRC already checked) with offset in
    ``[start_offset, end_offset)``, in offset order. Control batches (transaction markers) are skipped, as
    a Kafka consumer skips them. ``key`` names the object in errors."""
    payloads: list[bytes] = []
    heads: list[BatchHeader] = []
    for data, header in batches:
        if header.is_control or not header.record_count:  # markers, and batches a cleaning emptied
            continue
        try:
            payloads.append(decompress(header.compression, memoryview(data)[HEADER_SIZE : header.size]))
        except Exception as exc:  # cramjam raises its own DecompressionError, gzip OSError, ...
            raise CorruptSegmentError(f"cannot decompress batch at offset {header.base_offset}: {exc}",
                                      key=key) from exc
        heads.append(header)
    if not heads:
        return empty_batch()
    counts = np.fromiter((h.record_count for h in heads), dtype=np.int64, count=len(heads))
    sizes = np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads))
    raw = b"".join(payloads) + bytes(_PAD)
    total = int(counts.sum())
    marks = _walk(raw, total, key)
    buf = np.frombuffer(raw, dtype=np.uint8)
    lengths, prefix = _varints(buf, marks[:-1], 5, key)
    starts, ends = marks[:-1] + prefix, marks[1:]
    if (lengths < 0).any() or (ends > len(raw) - _PAD).any():
        raise CorruptSegmentError("a record declares a length outside its batch", key=key)
    # A batch whose records do not fill it exactly would shift every later record: refuse it.
    batch_ends = np.cumsum(sizes)
    last_of_batch = np.cumsum(counts) - 1
    if not np.array_equal(ends[last_of_batch], batch_ends):
        bad = int(np.nonzero(ends[last_of_batch] != batch_ends)[0][0])
        raise CorruptSegmentError(f"records of the batch at offset {heads[bad].base_offset} do not fill it",
                                  key=key)
    which = np.repeat(np.arange(len(heads)), counts)
    fields = _fields(buf, starts, ends, key)
    base = np.fromiter((h.base_offset for h in heads), dtype=np.int64, count=len(heads))
    offsets = base[which] + fields.offset_delta
    first_ts = np.fromiter((h.first_timestamp for h in heads), dtype=np.int64, count=len(heads))
    max_ts = np.fromiter((h.max_timestamp for h in heads), dtype=np.int64, count=len(heads))
    ts_type = np.fromiter((h.timestamp_type for h in heads), dtype=np.int32, count=len(heads))
    # LogAppendTime: every record carries the batch's maxTimestamp (the broker's append time), as in Kafka.
    timestamps = np.where(ts_type[which] == 1, max_ts[which], first_ts[which] + fields.timestamp_delta)

    lo = int(np.searchsorted(offsets, start_offset, side="left"))
    hi = len(offsets) if end_offset is None else int(np.searchsorted(offsets, end_offset, side="left"))
    arrow_buf = pa.py_buffer(raw)
    n = hi - lo
    columns = [
        _binary(arrow_buf, buf, fields.key_start[lo:hi], fields.key_len[lo:hi]),
        _binary(arrow_buf, buf, fields.value_start[lo:hi], fields.value_len[lo:hi]),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.array(offsets[lo:hi]),
        pa.array(timestamps[lo:hi] * 1000, pa.int64()).view(pa.timestamp("us", tz="UTC")),
        pa.array(ts_type[which[lo:hi]]),
        _headers(arrow_buf, buf, fields, lo, hi),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=KAFKA_ARROW_SCHEMA)


def _walk(raw: bytes, count: int, key: str | None) -> np.ndarray:
    """Where each record (its length prefix) begins, plus where the last one ends. The one sequential step:
    a record's position is known only once the previous record's length has been read. Kept to the bare
    minimum per record; the lengths are decoded again and checked afterwards, for all records at once."""
    bounds: list[int] = []
    mark = bounds.append
    pos = 0
    try:
        for _ in range(count):
            mark(pos)
            b = raw[pos]
            if b < 0x80:
                pos += 1 + ((b >> 1) ^ -(b & 1))
            else:
                b1 = raw[pos + 1]
                if b1 < 0x80:
                    zz = (b & 0x7F) | (b1 << 7)
                    pos += 2 + ((zz >> 1) ^ -(zz & 1))
                else:
                    zz, after = _slow_varint(raw, pos, key)
                    pos = after + ((zz >> 1) ^ -(zz & 1))
    except IndexError:
        raise CorruptSegmentError("a record length runs past the end of its batch", key=key) from None
    mark(pos)
    return np.array(bounds, dtype=np.int64)


def _slow_varint(raw: bytes, pos: int, key: str | None) -> tuple[int, int]:
    value = shift = 0
    for _ in range(5):
        b = raw[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
    raise CorruptSegmentError("record length varint longer than 5 bytes", key=key)


def _varints(buf: np.ndarray, pos: np.ndarray, max_bytes: int, key: str | None) -> tuple[np.ndarray, np.ndarray]:
    """Zigzag varints starting at every position of ``pos``: (values, encoded sizes)."""
    b = buf[pos]
    value = (b & 0x7F).astype(np.uint64)
    size = np.ones(len(pos), dtype=np.int64)
    more = np.nonzero(b >= 0x80)[0]
    shift = 7
    while len(more):
        if shift >= 7 * max_bytes:
            raise CorruptSegmentError(f"record varint longer than {max_bytes} bytes", key=key)
        b = buf[pos[more] + size[more]]
        value[more] |= (b & 0x7F).astype(np.uint64) << np.uint64(shift)
        size[more] += 1
        more = more[b >= 0x80]
        shift += 7
    signed = (value >> np.uint64(1)).astype(np.int64) ^ -(value & np.uint64(1)).astype(np.int64)
    return signed, size


class _Fields:
    __slots__ = ("header_count", "header_fields", "key_len", "key_start", "offset_delta", "timestamp_delta",
                 "value_len", "value_start")

    def __init__(self) -> None:
        self.header_fields: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []


def _fields(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, key: str | None) -> _Fields:
    """Decode every record's fields, one field at a time across all records."""
    out = _Fields()
    pos = starts + 1  # the attributes byte: unused by Kafka today
    out.timestamp_delta, size = _varints(buf, pos, 10, key)
    pos += size
    out.offset_delta, size = _varints(buf, pos, 5, key)
    pos += size
    out.key_len, size = _varints(buf, pos, 5, key)
    out.key_start = pos + size
    pos = out.key_start + np.maximum(out.key_len, 0)
    _check(pos, ends, out.key_len, key, "key")
    out.value_len, size = _varints(buf, pos, 5, key)
    out.value_start = pos + size
    pos = out.value_start + np.maximum(out.value_len, 0)
    _check(pos, ends, out.value_len, key, "value")
    out.header_count, size = _varints(buf, pos, 5, key)
    pos += size
    if (out.header_count < 0).any():
        raise CorruptSegmentError("record with a negative header count", key=key)
    # Header j of every record that has more than j headers, one level at a time.
    level = 0
    rows = np.nonzero(out.header_count > 0)[0]
    while len(rows):
        p = pos[rows]
        klen, size = _varints(buf, p, 5, key)
        kstart = p + size
        p = kstart + np.maximum(klen, 0)
        _check(p, ends[rows], klen, key, "header key")
        if (klen < 0).any():
            raise CorruptSegmentError("record header with a null key", key=key)
        vlen, size = _varints(buf, p, 5, key)
        vstart = p + size
        p = vstart + np.maximum(vlen, 0)
        _check(p, ends[rows], vlen, key, "header value")
        pos[rows] = p
        out.header_fields.append((rows, kstart, klen, vstart, vlen))
        level += 1
        rows = rows[out.header_count[rows] > level]
    if not np.array_equal(pos, ends):
        bad = int(np.nonzero(pos != ends)[0][0])
        raise CorruptSegmentError(f"record {bad} does not end where its length says", key=key)
    return out


def _check(pos: np.ndarray, ends: np.ndarray, lengths: np.ndarray, key: str | None, what: str) -> None:
    if (pos > ends).any() or (lengths < -1).any():
        raise CorruptSegmentError(f"record {what} runs past the end of its record", key=key)


def _binary(arrow_buf: pa.Buffer, buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """A binary array of ``buf[start:start+length]`` (length -1 = null), built as Arrow binary views over
    the buffer and cast to plain binary: the copy happens in C++, not per value in Python."""
    n = len(starts)
    views = np.zeros((n, 4), dtype=np.int32)
    lens = np.maximum(lengths, 0)
    views[:, 0] = lens
    long = np.nonzero(lens > _INLINE)[0]
    if len(long):
        s = starts[long]
        views[long, 1] = buf[s[:, None] + np.arange(4)].view("<i4")[:, 0]  # 4-byte prefix, little-endian
        views[long, 3] = s  # buffer index (column 2) stays 0: there is one data buffer
    short = np.nonzero((lens > 0) & (lens <= _INLINE))[0]
    if len(short):
        inline = buf[starts[short, None] + np.arange(_INLINE)]
        inline[np.arange(_INLINE)[None, :] >= lens[short, None]] = 0
        views.view(np.uint8).reshape(n, 16)[short, 4:] = inline
    validity = None
    if (lengths < 0).any():
        validity = pa.py_buffer(np.packbits(lengths >= 0, bitorder="little"))
    view_array = pa.Array.from_buffers(pa.binary_view(), n, [validity, pa.py_buffer(views), arrow_buf])
    return view_array.cast(pa.binary())


def _headers(arrow_buf: pa.Buffer, buf: np.ndarray, fields: _Fields, lo: int, hi: int) -> pa.Array:
    counts = fields.header_count[lo:hi]
    list_offsets = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=list_offsets[1:])
    total = int(list_offsets[-1])
    # A record without headers has null headers, as in Spark's Kafka source (and Spark turns nulls into rows
    # faster than empty lists).
    none = pa.array(counts == 0)
    if total == 0:
        return pa.ListArray.from_arrays(pa.array(list_offsets), pa.array([], _HEADER_TYPE), type=_HEADERS_TYPE,
                                        mask=none)
    # Header j of record r goes to slot list_offsets[r - lo] + j of the flattened struct array.
    kstart = np.empty(total, dtype=np.int64)
    klen = np.empty(total, dtype=np.int64)
    vstart = np.empty(total, dtype=np.int64)
    vlen = np.empty(total, dtype=np.int64)
    for j, (rows, ks, kl, vs, vl) in enumerate(fields.header_fields):
        keep = (rows >= lo) & (rows < hi)
        slot = list_offsets[rows[keep] - lo] + j
        kstart[slot], klen[slot], vstart[slot], vlen[slot] = ks[keep], kl[keep], vs[keep], vl[keep]
    keys = _binary(arrow_buf, buf, kstart, klen)
    try:
        key_strings = keys.cast(pa.string())
    except pa.ArrowInvalid:
        # Java's String decoding replaces malformed UTF-8 rather than failing; so do we.
        key_strings = pa.array([k.decode("utf-8", "replace") for k in keys.to_pylist()], pa.string())
    values = _binary(arrow_buf, buf, vstart, vlen)
    structs = pa.StructArray.from_arrays([key_strings, values], fields=list(_HEADER_TYPE))
    return pa.ListArray.from_arrays(pa.array(list_offsets), structs, type=_HEADERS_TYPE, mask=none)
