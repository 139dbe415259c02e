"""Pack objects (``pack-….kfp``): segments flushed together, stored as one object.

Two kinds of stores write them: a physical partition's virtual partitions (lanes), in that physical partition's
directory; and the partitions of a plain topic that one shard flushes in the same tick, in the topic's `packs/`
directory (kafscale.broker.packer). The trailer's layout tells them apart: (P, V) for a virtual topic, and
(0, partitions) for a plain one, whose lanes are its partitions.

Layout (big-endian; docs/format.md has the byte table):

    lane 1 segment   a segment object as segment.py writes it (header, batches, footer)
    lane 1 index     an index object as index.py writes it, for that segment
    lane 2 segment
    lane 2 index
    …
    trailer          b"PKT1" · i32 physical partitions · i32 virtual partitions · i32 lane count · per lane: i32 lane
                     · i64 owner epoch · i64 base offset · i64 segment position · i32 segment size · i32 index size
                     · u32 CRC32C of the trailer so far · i32 trailer size · b"PACK"

Each lane's bytes are contiguous and byte-identical to the segment and index objects a plain partition writes, so
a lane is read as a byte range of the pack with the same code (and the same checks) as a segment object, and a
fetch never reads another lane's records. The trailer makes a pack self-describing: rebuilding metadata from the
object store alone reads the last bytes of each pack to find its lanes, and the janitor learns from it which
lanes' commits could name the pack (their base offsets), and which owner incarnation wrote each (its epoch: a
successor's segment at the same offset wins, and a fenced writer's segment is garbage), without reading the
segments. The topic's layout (P and V) is there for a rebuild from the object store alone.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from crc32c import crc32c

from kafscale.storage.batch import CorruptSegmentError
from kafscale.storage.index import INDEX_HEADER_SIZE
from kafscale.storage.segment import SEGMENT_FOOTER_SIZE, SEGMENT_HEADER_SIZE, BuiltSegment

TRAILER_MAGIC = b"PKT1"
END_MAGIC = b"PACK"
_COUNT = struct.Struct(">4siii")
_LANE = struct.Struct(">iqqqii")
_END = struct.Struct(">Ii4s")
# A reader fetches this many bytes from the end first: the whole trailer of a pack of up to 226 lanes (a larger
# one says how many bytes its trailer needs).
TAIL_READ = 8192


@dataclass(frozen=True, slots=True)
class PackedLane:
    """Where one lane's segment and its index lie in a pack."""

    lane: int
    epoch: int  # the owner epoch of the lane's writer
    base: int  # the segment's base offset
    position: int  # of the segment's first byte
    size: int  # of the segment
    index_size: int  # the index follows the segment at position + size

    @property
    def index_position(self) -> int:
        return self.position + self.size


@dataclass(frozen=True, slots=True)
class PackTrailer:
    physical: int  # the topic's physical partitions (P)
    virtual: int  # and virtual ones (V)
    lanes: list[PackedLane]


@dataclass(frozen=True, slots=True)
class BuiltPack:
    data: bytes
    lanes: list[PackedLane]


def build_pack(segments: Sequence[tuple[int, int, BuiltSegment]], physical: int, virtual: int) -> BuiltPack:
    """One object from each lane's built segment, in the order given: (lane, owner epoch, segment), each lane once;
    physical and virtual: the topic's layout (0 and its partition count for a plain topic)."""
    if not segments:
        raise ValueError("a pack holds at least one lane")
    seen = [lane for lane, _, _ in segments]
    if len(set(seen)) != len(seen):
        raise ValueError(f"a lane is packed twice: {seen}")
    parts: list[bytes] = []
    lanes: list[PackedLane] = []
    position = 0
    for lane, epoch, built in segments:
        lanes.append(PackedLane(lane, epoch, built.info.base_offset, position, len(built.data), len(built.index)))
        parts += (built.data, built.index)
        position += len(built.data) + len(built.index)
    trailer = bytearray(_COUNT.pack(TRAILER_MAGIC, physical, virtual, len(lanes)))
    for p in lanes:
        trailer += _LANE.pack(p.lane, p.epoch, p.base, p.position, p.size, p.index_size)
    trailer += _END.pack(crc32c(bytes(trailer)), len(trailer) + _END.size, END_MAGIC)
    parts.append(bytes(trailer))
    return BuiltPack(b"".join(parts), lanes)


class TrailerBeyondTail(Exception):
    """The trailer is longer than the bytes read from the end: read `size` bytes from the end and parse again."""

    def __init__(self, size: int) -> None:
        super().__init__(f"the pack trailer needs the last {size} bytes")
        self.size = size


def parse_trailer(tail: bytes, object_size: int, key: str | None = None) -> PackTrailer:
    """The lanes of a pack of object_size bytes, from its last bytes (`tail`; the last TAIL_READ bytes hold the
    trailer of a pack of up to 226 lanes). Raises TrailerBeyondTail when the trailer is longer than `tail`, and
    CorruptSegmentError naming the object for anything damaged."""
    if len(tail) < _COUNT.size + _END.size or len(tail) > object_size:
        raise CorruptSegmentError(f"pack tail of {len(tail)} bytes cannot hold a trailer", key=key)
    crc, size, end = _END.unpack_from(tail, len(tail) - _END.size)
    if end != END_MAGIC:
        raise CorruptSegmentError(f"pack ends with {end!r}, not {END_MAGIC!r}", key=key,
                                  position=object_size - 4)
    if not _COUNT.size + _END.size <= size <= object_size:
        raise CorruptSegmentError(f"pack trailer of {size} bytes does not fit the object of {object_size}",
                                  key=key, position=object_size - 8)
    if size > len(tail):
        raise TrailerBeyondTail(size)
    start = len(tail) - size
    body = tail[start:len(tail) - _END.size]
    if crc32c(body) != crc:
        raise CorruptSegmentError("pack trailer CRC mismatch", key=key, position=object_size - _END.size)
    magic, physical, virtual, count = _COUNT.unpack_from(body, 0)
    if magic != TRAILER_MAGIC or count < 1 or len(body) != _COUNT.size + count * _LANE.size:
        raise CorruptSegmentError(f"pack trailer {magic!r} with {count} lanes in {len(body)} bytes", key=key,
                                  position=object_size - size)
    lanes = [PackedLane(*_LANE.unpack_from(body, _COUNT.size + i * _LANE.size)) for i in range(count)]
    end_of_lanes = object_size - size
    expected = 0
    bad_ratio = physical != 0 and (physical > virtual or virtual % physical)
    if physical < 0 or virtual < 1 or bad_ratio or any(p.lane >= virtual for p in lanes):
        raise CorruptSegmentError(f"pack trailer layout {virtual} over {physical} does not hold lanes "
                                  f"{[p.lane for p in lanes]}", key=key, position=object_size - size)
    if len({p.lane for p in lanes}) != len(lanes) or any(p.lane < 0 or p.base < 0 or p.epoch < 0 for p in lanes):
        raise CorruptSegmentError(f"pack lanes {[p.lane for p in lanes]} are not distinct lanes", key=key,
                                  position=object_size - size)
    for p in lanes:
        if (p.position != expected or p.size < SEGMENT_HEADER_SIZE + SEGMENT_FOOTER_SIZE
                or p.index_size < INDEX_HEADER_SIZE):
            raise CorruptSegmentError(f"pack lane {p.lane} at {p.position} (+{p.size}, index {p.index_size}) does "
                                      f"not follow the previous one at {expected}", key=key,
                                      position=object_size - size)
        expected = p.index_position + p.index_size
    if expected != end_of_lanes:
        raise CorruptSegmentError(f"pack lanes end at {expected}, the trailer starts at {end_of_lanes}", key=key,
                                  position=object_size - size)
    return PackTrailer(physical, virtual, lanes)
