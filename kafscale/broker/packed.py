"""Finding packed segments (virtual partitions', and plain topics' flushed with `pack_segments`) in the object store,
from the packs' trailers: what restore and rebuild roll forward from (kafscale.broker.snapshot) when no commit names
them any more, or yet."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from dataclasses import dataclass

from kafscale.storage import keys as object_keys
from kafscale.storage.async_store import AsyncObjectStore
from kafscale.storage.batch import CorruptSegmentError
from kafscale.storage.object_store import ObjectInfo
from kafscale.storage.pack import TAIL_READ, PackedLane, PackTrailer, TrailerBeyondTail, parse_trailer
from kafscale.storage.segment import SEGMENT_FOOTER_SIZE, parse_segment_footer

log = logging.getLogger(__name__)
READS_AT_ONCE = 32  # trailer reads in flight: a topic flushed in packs for a week has hundreds of thousands


@dataclass(frozen=True, slots=True)
class PackedSegment:
    """One lane's segment in one pack."""

    name: str  # the pack's name, as segment records hold it (storage.keys.pack_name)
    key: str  # its object key
    lane: PackedLane
    layout: tuple[int, int]  # the topic's (physical, virtual) partition counts when the pack was written


async def packed_segments(objects: AsyncObjectStore, namespace: str, topic: str,
                          listed: list[ObjectInfo]) -> dict[int, list[PackedSegment]]:
    """The lane segments in the packs among `listed` (objects of the topic), by lane."""
    found: dict[int, list[PackedSegment]] = defaultdict(list)
    slots = asyncio.Semaphore(READS_AT_ONCE)

    async def read(o: ObjectInfo, name: str) -> None:
        async with slots:
            try:
                trailer = await read_trailer(objects, o.key, o.size)
            except CorruptSegmentError as e:  # a damaged pack: its segments are not rolled forward, the rest are
                log.warning("pack %s skipped: %s", o.key, e)
                return
        for lane in trailer.lanes:
            found[lane.lane].append(PackedSegment(name, o.key, lane, (trailer.physical, trailer.virtual)))

    await asyncio.gather(*(read(o, name) for o in listed
                           if (name := object_keys.pack_name_of(o.key, namespace, topic)) is not None))
    for segments in found.values():
        segments.sort(key=lambda s: (s.lane.base, s.lane.epoch, s.name))  # the same whatever order reads finished
    return found


async def read_trailer(objects: AsyncObjectStore, key: str, size: int) -> PackTrailer:
    tail_size = min(TAIL_READ, size)
    try:
        return parse_trailer(await objects.get_range(key, size - tail_size, tail_size), size, key=key)
    except TrailerBeyondTail as e:
        return parse_trailer(await objects.get_range(key, size - e.size, e.size), size, key=key)


async def last_offset(objects: AsyncObjectStore, segment: PackedSegment) -> int:
    """The last offset of a packed segment, from its footer."""
    lane = segment.lane
    tail = await objects.get_range(segment.key, lane.position + lane.size - SEGMENT_FOOTER_SIZE, SEGMENT_FOOTER_SIZE)
    return parse_segment_footer(tail, segment.key, object_size=lane.size).last_offset


def virtual_layout(found: dict[int, list[PackedSegment]]) -> tuple[int, int] | None:
    """(physical, virtual) partition counts of the topic these packs belong to, as their trailers record it, for a
    rebuild from the object store alone: the newest pack's, should an older topic of the name have left others."""
    packs = [s for segments in found.values() for s in segments]
    if not packs:
        return None
    return max(packs, key=lambda s: s.lane.epoch).layout
