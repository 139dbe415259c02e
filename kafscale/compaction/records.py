"""The records of a stored v2 batch, as the cleaner needs them, and a batch rebuilt from the ones it keeps.

Records are decoded by aiokafka's compiled reader (about 0.5 µs a record: a pass decodes every record of the log
twice, to map its keys and to filter them); only the records of a batch that loses some, or gets a delete horizon,
are encoded again, here. The batch's base offset, last offset delta, producer id, epoch and base sequence stay as
they were: offsets never change, and a producer's sequence bookkeeping still matches the batch. A record's
timestamp stays too: a batch that gets a delete horizon (KIP-534) has that horizon as its base timestamp, and its
records' deltas are written relative to it.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

from aiokafka.record.default_records import DefaultRecordBatch
from crc32c import crc32c

from kafscale.storage import varint
from kafscale.storage.batch import DELETE_HORIZON_BIT, TIMESTAMP_TYPE_BIT, BatchHeader, Buffer, CorruptSegmentError
from kafscale.storage.codecs import compress

_AFTER_CRC = struct.Struct(">hiqqqhii")  # attributes .. record count: what the batch CRC covers, then records
_BEFORE_CRC = struct.Struct(">qiib")  # base offset, batch length, partition leader epoch, magic
_LENGTH_AFTER_LENGTH = 4 + 1 + 4  # leader epoch, magic, crc: the batch length counts them and what the CRC covers


class Record(NamedTuple):  # a tuple: a pass makes one per record of the log
    offset_delta: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]

    @property
    def tombstone(self) -> bool:
        """A null value: "delete this key"."""
        return self.value is None

    def encode(self, base_timestamp: int) -> bytes:
        body = bytearray(b"\x00")  # record attributes: none are defined
        body += varint.encode(self.timestamp - base_timestamp) + varint.encode(self.offset_delta)
        _bytes(body, self.key)
        _bytes(body, self.value)
        body += varint.encode(len(self.headers))
        for name, value in self.headers:
            _bytes(body, name.encode())
            _bytes(body, value)
        return varint.encode(len(body)) + bytes(body)


def decoded(batch: Buffer, header: BatchHeader, key: str | None = None) -> list[Any]:
    """aiokafka's records of one whole v2 batch (its CRC already checked): .offset, .timestamp, .key, .value,
    .headers."""
    try:
        return list(DefaultRecordBatch(bytes(batch)))
    except Exception as e:  # aiokafka's reader raises its own errors for records that do not parse
        raise CorruptSegmentError(f"records of the batch at offset {header.base_offset} cannot be read: {e}",
                                  key=key) from e


def as_record(r: Any, base_offset: int) -> Record:
    return Record(r.offset - base_offset, r.timestamp, r.key, r.value, r.headers)


def records_of(batch: Buffer, header: BatchHeader, key: str | None = None) -> list[Record]:
    """The records of one whole v2 batch (its CRC already checked)."""
    return [as_record(r, header.base_offset) for r in decoded(batch, header, key)]


def keys_and_offsets(batch: Buffer, header: BatchHeader, key: str | None = None) -> list[tuple[bytes | None, int]]:
    """(key, offset) of each record of a batch: what the key map needs, and no more."""
    return [(r.key, r.offset) for r in decoded(batch, header, key)]


def keyless(batch: Buffer, header: BatchHeader) -> list[int]:
    """The indexes (in the batch) of its records without a key: what a compacted topic refuses."""
    return [i for i, r in enumerate(decoded(batch, header)) if r.key is None]  # the produce path: no Records


def rebuild(header: BatchHeader, kept: list[Record], *, horizon_ms: int | None) -> bytes:
    """The batch with only `kept` (in order, at least one), its base timestamp the delete horizon when one is
    given (and the horizon bit set) or the original's otherwise."""
    base_ts = header.first_timestamp if horizon_ms is None else horizon_ms
    records = b"".join(r.encode(base_ts) for r in kept)
    attributes = header.attributes & ~DELETE_HORIZON_BIT | (0 if horizon_ms is None else DELETE_HORIZON_BIT)
    covered = _AFTER_CRC.pack(attributes, header.last_offset_delta, base_ts, header.max_timestamp,
                              header.producer_id, header.producer_epoch, header.base_sequence,
                              len(kept)) + compress(header.compression, records)
    head = _BEFORE_CRC.pack(header.base_offset, _LENGTH_AFTER_LENGTH + len(covered), header.partition_leader_epoch, 2)
    return head + crc32c(covered).to_bytes(4, "big") + covered


def emptied(header: BatchHeader) -> bytes:
    """The batch with no records left, uncompressed: what stands for a group of segments a cleaning emptied (its
    offsets stay covered, and a consumer's position moves past it, as past Kafka's emptied batches)."""
    # Only the timestamp type stays: no codec for no records, and neither a control batch (a reader expects its
    # marker record) nor a transactional one (nothing left to decide).
    covered = _AFTER_CRC.pack(header.attributes & TIMESTAMP_TYPE_BIT, header.last_offset_delta,
                              header.first_timestamp, header.max_timestamp, header.producer_id,
                              header.producer_epoch, header.base_sequence, 0)
    head = _BEFORE_CRC.pack(header.base_offset, _LENGTH_AFTER_LENGTH + len(covered), header.partition_leader_epoch, 2)
    return head + crc32c(covered).to_bytes(4, "big") + covered


def _bytes(out: bytearray, data: bytes | None) -> None:
    if data is None:
        out += varint.encode(-1)
    else:
        out += varint.encode(len(data))
        out += data
