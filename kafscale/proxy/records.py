"""The proxy's record work: tag what a client produces with its virtual partition, and keep only one virtual
partition's batches of what the upstream returns.

Upstream, a physical partition numbers the records of all its virtual partitions consecutively. So the proxy
cannot tell them apart by offset, as the seed's encoding assumed: every record it produces carries a header
`kafscale.vp` naming its virtual partition, and a Fetch keeps the batches whose records carry the requested one.
A virtual partition's offsets are the upstream offsets of its records: strictly increasing, with gaps where
other virtual partitions' records lie, as a compacted Kafka partition has gaps.

A client produces one batch per partition, so the proxy writes each batch to the upstream whole, and every batch
upstream holds one virtual partition's records: the first record's tag names the batch. Every record is tagged
all the same, so that a batch compaction has thinned still names its virtual partition. Records produced without
the proxy carry no tag and belong to the physical partition's first virtual partition (the one of the same
index), so a topic made virtual later keeps its history readable.

When a fetched range holds nothing of the requested virtual partition, the client must still move past it, or
it would ask for the same range for ever: the proxy ends the answer with a control batch spanning the range
skipped, one COMMIT marker at its last offset, which every client steps over (a transaction marker of no
transaction). Not the empty batch compaction leaves: kafka-python, aiokafka and the Java client step over that
too, but librdkafka takes a fetch of nothing else for a message too large to fetch, doubles its fetch size and
reports MSG_SIZE_TOO_LARGE, and does not move the position it commits.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from dataclasses import dataclass

from crc32c import crc32c

from kafscale.storage import varint
from kafscale.storage.batch import (
    ATTRIBUTES_OFFSET,
    CONTROL_BIT,
    CRC_OFFSET,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_V2,
    Buffer,
    InvalidBatchError,
    split_batches,
)
from kafscale.storage.codecs import compress, decompress

TAG = b"kafscale.vp"
_HEADER = struct.Struct(">qiibIhiqqqhii")  # a v2 batch header, read leniently (compacted batches welcome)
_LENGTH = struct.Struct(">i")
_PRODUCER = struct.Struct(">qh")
_PRODUCER_OFFSET = 43
_U32 = struct.Struct(">I")
LANE_CACHE = 100_000  # batches whose virtual partition is remembered, so several consumers decompress each once


zigzag = varint.encode  # a signed varint, as record fields are written
_read_zigzag = varint.decode


def _headers_at(record: Buffer, pos: int) -> int:
    """The position of a record body's header count, from the body's start."""
    pos += 1  # attributes
    _, pos = _read_zigzag(record, pos)  # timestamp delta
    _, pos = _read_zigzag(record, pos)  # offset delta
    for _ in range(2):  # key, value
        length, pos = _read_zigzag(record, pos)
        pos += max(length, 0)
    return pos


class TagError(ValueError):
    """A produced batch whose records do not parse: the client gets CORRUPT_MESSAGE."""


def tag(records: Buffer, lane: int, producer: tuple[int, int] | None = None) -> bytes:
    """The batches of a Produce partition with every record tagged `lane`; their producer id and epoch replaced
    by `producer` when given. Raises InvalidBatchError for a batch that fails Kafka's checks, TagError for
    records that do not parse."""
    value = str(lane).encode()
    own = zigzag(len(TAG)) + TAG + zigzag(len(value)) + value
    out = bytearray()
    for pos, header in split_batches(records):
        if header.attributes & CONTROL_BIT:
            raise InvalidBatchError("a produced batch is a control batch", error_code=87)
        view = memoryview(records)[pos : pos + header.size]
        try:
            plain = decompress(header.compression, view[HEADER_SIZE:])
            body = _tagged(plain, header.record_count, own)
        except Exception as e:  # a codec's own error, struct.error, IndexError, ValueError: the client's bytes
            raise TagError(f"records of the batch do not parse: {e}") from None
        payload = compress(header.compression, body)
        batch = bytearray(view[:HEADER_SIZE])
        _LENGTH.pack_into(batch, 8, HEADER_SIZE - LOG_OVERHEAD + len(payload))
        if producer is not None:
            _PRODUCER.pack_into(batch, _PRODUCER_OFFSET, *producer)
        batch += payload
        _U32.pack_into(batch, CRC_OFFSET, crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:]))
        out += batch
    return bytes(out)


def _tagged(plain: bytes, count: int, own: bytes) -> bytes:
    """The records with the proxy's tag as their first header. A `kafscale.vp` header the client sent (copied
    from a record it consumed through a proxy, say) is dropped: the proxy's tag is the only one a record has."""
    out = bytearray()
    pos = 0
    for _ in range(count):
        length, body = _read_zigzag(plain, pos)
        end = body + length
        if length < 0 or end > len(plain):
            raise ValueError("a record runs past its batch")
        at = _headers_at(plain, body)
        headers, after = _read_zigzag(plain, at)
        kept, cursor = [], after
        for _ in range(headers):
            start = cursor
            key_len, cursor = _read_zigzag(plain, cursor)
            key = plain[cursor : cursor + key_len]
            cursor += max(key_len, 0)
            value_len, cursor = _read_zigzag(plain, cursor)
            cursor += max(value_len, 0)
            if key != TAG:
                kept.append(plain[start:cursor])
        if headers < 0 or cursor != end:
            raise ValueError("a record's headers do not fill it")
        new = b"".join([plain[body:at], zigzag(len(kept) + 1), own, *kept])
        out += zigzag(len(new))
        out += new
        pos = end
    if pos != len(plain):
        raise ValueError("records do not fill their batch")
    return bytes(out)


def producer_of(records: Buffer) -> tuple[int, int]:
    """The producer id and epoch of a Produce partition's first batch (-1 when it is not idempotent)."""
    if len(records) < HEADER_SIZE:
        return -1, -1
    pid, epoch = _PRODUCER.unpack_from(records, _PRODUCER_OFFSET)
    return int(pid), int(epoch)


@dataclass(frozen=True, slots=True)
class Filtered:
    records: bytes
    kept: int  # batches of the virtual partition (and control batches) kept
    dropped: int  # other virtual partitions' batches left out


class Lanes:
    """Which virtual partition each upstream batch belongs to, remembered for the next consumer that asks."""

    def __init__(self, size: int = LANE_CACHE) -> None:
        self._known: OrderedDict[tuple[str, int, int, int], int | None] = OrderedDict()
        self.size = size

    def of(self, topic: str, physical: int, batch: memoryview, base_offset: int, crc: int,
           attributes: int, count: int) -> int | None:
        """The virtual partition a batch holds; None for a control batch, an empty or an untagged one."""
        key = (topic, physical, base_offset, crc)
        if key in self._known:
            self._known.move_to_end(key)
            return self._known[key]
        lane = None
        if not attributes & CONTROL_BIT and count > 0:
            try:
                lane = _first_tag(decompress(attributes & 0x07, batch[HEADER_SIZE:]))
            except Exception:  # not ours to judge: it goes, as an untagged batch, to the client, which checks it
                lane = None
        self._known[key] = lane
        if len(self._known) > self.size:
            self._known.popitem(last=False)
        return lane


def _first_tag(plain: bytes) -> int | None:
    """The lane the proxy's tag names: the first header of the batch's first record (None if it is not a tag)."""
    _, body = _read_zigzag(plain, 0)
    at = _headers_at(plain, body)
    headers, pos = _read_zigzag(plain, at)
    if headers < 1:
        return None
    key_len, pos = _read_zigzag(plain, pos)
    if plain[pos : pos + key_len] != TAG:
        return None
    pos += key_len
    value_len, pos = _read_zigzag(plain, pos)
    value = plain[pos : pos + value_len]
    return int(value) if value.isdigit() else None


def keep_lane(records: Buffer, topic: str, lane: int, layout: tuple[int, int], fetch_offset: int,
              lanes: Lanes) -> Filtered:
    """The batches of `records` (an upstream Fetch answer's, of lane's physical partition of `topic`, a topic of
    `layout` = (P, V)) that belong to `lane`, with control batches and empty ones; `lanes` knows each batch's
    lane. Untagged batches, and batches whose tag names no lane of this physical partition, belong to its first
    lane (the one of its index). If the answer reaches past what is kept, a skip batch ends it, spanning the
    rest. A trailing partial batch (a Fetch cut at its byte limit) is left out, as clients leave it."""
    physical_count, virtual_count = layout
    physical = lane % physical_count
    view = memoryview(records)
    out = bytearray()
    kept = dropped = 0
    pos, end = 0, len(view)
    reached = kept_until = fetch_offset  # the offset after the last batch seen, and after the last one kept
    while pos + HEADER_SIZE <= end:
        base, length, _, magic, crc, attributes, delta, *_, count = _HEADER.unpack_from(view, pos)
        size = length + LOG_OVERHEAD
        if pos + size > end or length < 0:
            break
        if magic != MAGIC_V2:  # an old-format message (v0/v1), written long before any proxy: untagged data
            if lane == physical:
                out += view[pos : pos + size]
                kept += 1
                kept_until = max(kept_until, base + 1)
            else:
                dropped += 1
            reached = max(reached, base + 1)  # its offset field is its last offset
            pos += size
            continue
        if length < HEADER_SIZE - LOG_OVERHEAD:
            break
        batch = view[pos : pos + size]
        owner = lanes.of(topic, physical, batch, base, crc, attributes, count)
        data = count > 0 and not attributes & CONTROL_BIT
        if data and (owner is None or not 0 <= owner < virtual_count or owner % physical_count != physical):
            owner = physical
        if owner is None or owner == lane:
            out += batch
            kept += 1
            kept_until = max(kept_until, base + delta + 1)
        else:
            dropped += 1
        reached = max(reached, base + delta + 1)
        pos += size
    if reached > kept_until:
        out += skip_batch(kept_until, reached - 1)
    return Filtered(bytes(out), kept, dropped)


_COMMIT_MARKER = b"\x00\x00\x00\x01"  # control record key: version 0, type 1 (COMMIT)
_MARKER_VALUE = b"\x00\x00\x00\x00\x00\x00"  # version 0, coordinator epoch 0
_CONTROL = CONTROL_BIT | 0x10  # a control batch is a transactional one


def skip_batch(first: int, last: int) -> bytes:
    """A control batch spanning offsets first..last with one COMMIT marker at `last`: what a client steps over."""
    delta = last - first
    body = (b"\x00" + zigzag(0) + zigzag(delta) + zigzag(len(_COMMIT_MARKER)) + _COMMIT_MARKER
            + zigzag(len(_MARKER_VALUE)) + _MARKER_VALUE + zigzag(0))
    record = zigzag(len(body)) + body
    batch = bytearray(HEADER_SIZE)
    _HEADER.pack_into(batch, 0, first, HEADER_SIZE - LOG_OVERHEAD + len(record), -1, MAGIC_V2, 0, _CONTROL, delta,
                      -1, -1, -1, -1, -1, 1)
    batch += record
    _U32.pack_into(batch, CRC_OFFSET, crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:]))
    return bytes(batch)
