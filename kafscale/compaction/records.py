"""The records of a stored v2 batch, as the cleaner needs them, and a batch rebuilt from the ones it keeps.

A record is kept as its raw bytes after the offset delta (key, value, headers), so a kept record is copied, never
re-encoded field by field. Its timestamp delta is written again only because a batch that gets a delete horizon
(KIP-534) has that horizon as its base timestamp, and the deltas stay relative to whatever the base is. The
batch's base offset, last offset delta, producer id, epoch and base sequence stay as they were: offsets never
change, and a producer's sequence bookkeeping still matches the batch.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from crc32c import crc32c

from kafscale.storage import varint
from kafscale.storage.batch import DELETE_HORIZON_BIT, HEADER_SIZE, BatchHeader, Buffer, CorruptSegmentError
from kafscale.storage.codecs import compress, decompress

_AFTER_CRC = struct.Struct(">hiqqqhii")  # attributes .. record count: what the batch CRC covers, then records
_BEFORE_CRC = struct.Struct(">qiib")  # base offset, batch length, partition leader epoch, magic
_LENGTH_AFTER_LENGTH = 4 + 1 + 4 + _AFTER_CRC.size  # leader epoch, magic, crc, then the CRC-covered header


@dataclass(frozen=True, slots=True)
class Record:
    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    tombstone: bool  # a null value: "delete this key"
    attributes: int
    tail: bytes  # the raw key, value and headers, as stored

    def encode(self, timestamp_delta: int) -> bytes:
        body = bytes([self.attributes]) + varint.encode(timestamp_delta) + varint.encode(self.offset_delta) + self.tail
        return varint.encode(len(body)) + body


def records_of(batch: Buffer, header: BatchHeader, key: str | None = None) -> list[Record]:
    """The records of one whole v2 batch (its CRC already checked)."""
    raw = decompress(header.compression, memoryview(batch)[HEADER_SIZE : header.size])
    out: list[Record] = []
    pos = 0
    try:
        for _ in range(header.record_count):
            length, pos = varint.decode(raw, pos)
            end = pos + length
            attributes = raw[pos]
            timestamp_delta, at = varint.decode(raw, pos + 1)
            offset_delta, at = varint.decode(raw, at)
            key_length, after_key_length = varint.decode(raw, at)
            key_end = after_key_length + max(key_length, 0)
            value_length, _ = varint.decode(raw, key_end)
            if end > len(raw) or key_end > end:
                raise IndexError
            out.append(Record(offset_delta, timestamp_delta,
                              None if key_length < 0 else raw[after_key_length:key_end],
                              value_length < 0, attributes, raw[at:end]))
            pos = end
    except (IndexError, varint.VarintError):
        raise CorruptSegmentError(f"a record of the batch at offset {header.base_offset} runs past it",
                                  key=key) from None
    if pos != len(raw):
        raise CorruptSegmentError(f"records of the batch at offset {header.base_offset} do not fill it", key=key)
    return out


def keyless(batch: Buffer, header: BatchHeader) -> list[int]:
    """The indexes (in the batch) of its records without a key: what a compacted topic refuses."""
    return [i for i, r in enumerate(records_of(batch, header)) if r.key is None]


def rebuild(header: BatchHeader, kept: list[Record], *, horizon_ms: int | None) -> bytes:
    """The batch with only `kept` (in order, at least one), its base timestamp the delete horizon when one is
    given (and the horizon bit set) or the original's otherwise."""
    base_ts = header.first_timestamp if horizon_ms is None else horizon_ms
    shift = header.first_timestamp - base_ts  # a record's absolute timestamp must not move
    records = b"".join(r.encode(r.timestamp_delta + shift) for r in kept)
    attributes = header.attributes & ~DELETE_HORIZON_BIT | (0 if horizon_ms is None else DELETE_HORIZON_BIT)
    covered = _AFTER_CRC.pack(attributes, header.last_offset_delta, base_ts, header.max_timestamp,
                              header.producer_id, header.producer_epoch, header.base_sequence,
                              len(kept)) + compress(header.compression, records)
    head = _BEFORE_CRC.pack(header.base_offset, _LENGTH_AFTER_LENGTH - _AFTER_CRC.size + len(covered),
                            header.partition_leader_epoch, 2)
    return head + crc32c(covered).to_bytes(4, "big") + covered
