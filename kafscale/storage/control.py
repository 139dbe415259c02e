"""Transaction markers: the control batches that end a transaction in each of its partitions.

A marker is a v2 record batch with the transactional and control attributes set, the producer's id and epoch,
no sequence, and one record: key = (version 0, type: 0 abort / 1 commit) as two int16, value = (version 0,
coordinator epoch int32). It is stored like any batch and fetched like any batch; clients drop control batches
and use an abort marker to end the aborted range they were told about (Fetch's AbortedTransactions).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from crc32c import crc32c

from kafscale.storage import varint
from kafscale.storage.batch import CONTROL_BIT, HEADER_SIZE, TRANSACTIONAL_BIT, BatchHeader, InvalidBatchError

ABORT, COMMIT = 0, 1
_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")
# the batch header up to the CRC, then from the attributes on (the CRC covers the latter)
_HEAD = struct.Struct(">qiib")
_TAIL = struct.Struct(">hiqqqhii")


@dataclass(frozen=True, slots=True)
class TxnMarker:
    """What a transaction coordinator asks a partition to write when a transaction ends."""

    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    commit: bool

    def batch(self, timestamp_ms: int) -> bytearray:
        """The control batch (base offset 0: the partition owner sets it when it appends)."""
        record = _record(_KEY.pack(0, COMMIT if self.commit else ABORT), _VALUE.pack(0, self.coordinator_epoch))
        tail = _TAIL.pack(TRANSACTIONAL_BIT | CONTROL_BIT, 0, timestamp_ms, timestamp_ms, self.producer_id,
                          self.producer_epoch, -1, 1) + record
        crc = crc32c(tail)
        body_length = 4 + 1 + 4 + len(tail)  # partition leader epoch, magic, crc, then the covered part
        return bytearray(_HEAD.pack(0, body_length, -1, 2) + struct.pack(">I", crc) + tail)


def marker_of(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> TxnMarker:
    """The marker a control batch holds (its CRC already checked). InvalidBatchError if it is not one."""
    if not header.is_control:
        raise InvalidBatchError("not a control batch", 87)
    view = memoryview(buf)[pos + HEADER_SIZE : pos + header.size]
    at = _skip_varint(view, 0)  # record length
    at += 1  # record attributes
    at = _skip_varint(view, at)  # timestamp delta
    at = _skip_varint(view, at)  # offset delta
    key_len, at = _read_varint(view, at)
    if key_len < _KEY.size:
        raise InvalidBatchError("control record key too short", 87)
    _, kind = _KEY.unpack_from(view, at)
    at += key_len
    value_len, at = _read_varint(view, at)
    coordinator_epoch = _VALUE.unpack_from(view, at)[1] if value_len >= _VALUE.size else -1
    if kind not in (ABORT, COMMIT):
        raise InvalidBatchError(f"unknown control record type {kind}", 87)
    return TxnMarker(header.producer_id, header.producer_epoch, coordinator_epoch, kind == COMMIT)


def _record(key: bytes, value: bytes) -> bytes:
    body = (b"\x00" + _varint(0) + _varint(0) + _varint(len(key)) + key + _varint(len(value)) + value
            + _varint(0))
    return _varint(len(body)) + body


def _varint(n: int) -> bytes:
    return varint.encode(n)


def _read_varint(view: memoryview, at: int) -> tuple[int, int]:
    try:
        return varint.decode(view, at)
    except varint.VarintError:
        raise InvalidBatchError("control record truncated", 87) from None


def _skip_varint(view: memoryview, at: int) -> int:
    return _read_varint(view, at)[1]
