"""One unit of Spark work: a committed segment, or a byte range of a large one, read and decoded on an executor.

A whole segment is fetched with one GET and checked completely (header, footer, every batch CRC, the
footer CRC over all batches, offset continuity) and against its commit record, so that an object
replaced after its commit is refused. A byte range is fetched with a ranged GET between two index
entries (batch boundaries); the footer CRC cannot be checked on part of a body, so every batch CRC
and the offset continuity from the index entry are.

Damage is data loss: with failOnDataLoss (the default) the task fails with the object key in the
message; without it the slice is skipped, logged, and recorded in the data-loss directory when one
is configured, so that whoever runs the job can count what was skipped.

Transactions: control batches (markers) are never emitted. Under read_committed the slice carries the
aborted transactions overlapping it, and a transactional batch of producer P whose offsets lie in one of P's
aborted ranges is dropped whole (a transactional batch belongs to exactly one transaction), as a Kafka
consumer drops it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from kafscale.cluster.records import AbortedTxn, SegmentMeta, StoredAt
from kafscale.pipeline.location import Location, objects_for
from kafscale.pipeline.records import decode_batches
from kafscale.storage.batch import BatchHeader, InvalidBatchError, split_batches
from kafscale.storage.object_store import ObjectNotFoundError
from kafscale.storage.segment import CorruptSegmentError, SegmentReader

log = logging.getLogger(__name__)

__all__ = ["DataLossError", "Slice", "count_data_loss", "is_aborted", "read_slice"]


class DataLossError(RuntimeError):
    """Committed data could not be read back intact; the message names the object."""


@dataclass(frozen=True, slots=True)
class Slice:
    location: Location
    topic: str
    partition: int
    segment: SegmentMeta
    start_offset: int  # records below are dropped (the segment may start earlier)
    end_offset: int  # exclusive
    byte_range: tuple[int, int, int] | None = None  # (first byte, end byte, offset of the first batch)
    min_timestamp: int | None = None  # batches whose maxTimestamp is below hold nothing the query wants
    fail_on_data_loss: bool = True
    data_loss_dir: str = ""
    aborted: tuple[AbortedTxn, ...] = ()  # read_committed: the aborted transactions overlapping the slice

    @property
    def nbytes(self) -> int:
        """Bytes this slice fetches."""
        return self.segment.size if self.byte_range is None else self.byte_range[1] - self.byte_range[0]

    @property
    def stored(self) -> StoredAt:
        """Where the segment is: an object of its own (at the key its commit names), or a range of a pack."""
        return self.segment.stored(self.location.namespace, self.topic, self.partition)


def read_slice(piece: Slice) -> Iterator[pa.RecordBatch]:
    try:
        batches = _fetch(piece)
        wanted = [(data, h) for data, h in batches
                  if h.last_offset >= piece.start_offset and h.base_offset < piece.end_offset
                  and (piece.min_timestamp is None or h.max_timestamp >= piece.min_timestamp)
                  and not (piece.aborted and is_aborted(h, piece.aborted))]
        if not wanted:
            return
        batch = decode_batches(wanted, piece.topic, piece.partition, start_offset=piece.start_offset,
                               end_offset=piece.end_offset, key=piece.stored.key)
    except (InvalidBatchError, ObjectNotFoundError) as exc:
        reason = f"segment {piece.stored.key} of {piece.topic}-{piece.partition} is unreadable: {exc}"
        if piece.fail_on_data_loss:
            raise DataLossError(reason + " (set failOnDataLoss=false to skip it)") from exc
        log.warning("skipping %s", reason)
        _record_data_loss(piece, reason)
        return
    if batch.num_rows:
        yield batch


def is_aborted(header: BatchHeader, aborted: tuple[AbortedTxn, ...]) -> bool:
    """A transactional data batch of a producer whose aborted range holds it (control batches are dropped
    anyway, by the decoder)."""
    if not header.is_transactional or header.is_control:
        return False
    return any(a.producer_id == header.producer_id and a.first_offset <= header.base_offset <= a.last_offset
               for a in aborted)


def _fetch(piece: Slice) -> list[tuple[memoryview, BatchHeader]]:
    objects = objects_for(piece.location)
    meta, at = piece.segment, piece.stored
    key = at.key
    if piece.byte_range is None:
        data = objects.get(key) if at.whole else objects.get_range(key, at.start, at.size)
        reader = SegmentReader(data, key=key, verify=True)
        info = reader.info
        if (info.base_offset, info.last_offset, info.size, info.crc) != (meta.base, meta.last, meta.size, meta.crc):
            raise CorruptSegmentError(
                f"object holds offsets {info.base_offset}..{info.last_offset} in {info.size} bytes"
                f" (crc {info.crc:#010x}), its commit says {meta.base}..{meta.last} in {meta.size} bytes"
                f" (crc {meta.crc:#010x})", key=key)
        return [(reader.batch_bytes(pos, h), h) for pos, h in reader.batches()]
    first, end, expected = piece.byte_range
    data = memoryview(objects.get_range(key, at.start + first, end - first))
    if len(data) != end - first:
        raise CorruptSegmentError(f"object shorter than its commit: {len(data)} bytes at {first}", key=key,
                                  position=first)
    out = []
    for rel, header in split_batches(data, verify_crc=True, key=key, base_position=first):
        if header.base_offset != expected and not (meta.cleaned and header.base_offset > expected):
            raise CorruptSegmentError(f"batch starts at offset {header.base_offset}, expected {expected}",
                                      key=key, position=first + rel)
        expected = header.last_offset + 1
        out.append((data[rel : rel + header.size], header))
    return out


def _record_data_loss(piece: Slice, reason: str) -> None:
    if not piece.data_loss_dir:
        return
    os.makedirs(piece.data_loss_dir, exist_ok=True)
    # One file per slice: a retried task rewrites its own file instead of counting twice.
    # The segment, not only the object: the lanes of a pack share its key.
    name = hashlib.sha1(f"{piece.stored.key}:{piece.partition}:{piece.segment.base}:{piece.byte_range}".encode()
                        ).hexdigest() + ".json"
    tmp = os.path.join(piece.data_loss_dir, "." + name)
    with open(tmp, "w") as fh:
        json.dump({"key": piece.stored.key, "topic": piece.topic, "partition": piece.partition,
                   "offsets": [max(piece.start_offset, piece.segment.base),
                               min(piece.end_offset, piece.segment.last + 1)],
                   "reason": reason}, fh)
    os.replace(tmp, os.path.join(piece.data_loss_dir, name))


def count_data_loss(directory: str) -> list[dict[str, object]]:
    """What the slices skipped under failOnDataLoss=false recorded in ``directory``."""
    if not directory or not os.path.isdir(directory):
        return []
    found = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json") and not name.startswith("."):
            with open(os.path.join(directory, name)) as fh:
                found.append(json.load(fh))
    return found
