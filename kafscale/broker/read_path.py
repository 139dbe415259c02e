"""Reading committed data of one partition: segment cache, index cache, ranged GETs, read-ahead.

Small segments are fetched whole (one GET, CRC-checked, cached) and the next ones are prefetched,
which is what a catching-up consumer wants. Segments too big to cache are read by ranged GETs
located through their sparse index.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kafscale.cluster.records import SegmentMeta, StoredAt
from kafscale.storage.batch import LOG_OVERHEAD, BatchHeader, batch_size, check_crc, read_header
from kafscale.storage.cache import ByteLRU
from kafscale.storage.index import SegmentIndex
from kafscale.storage.segment import SEGMENT_FOOTER_SIZE, BuiltSegment, CorruptSegmentError, SegmentReader

if TYPE_CHECKING:
    from kafscale.broker.partition_owner import PartitionOwner

log = logging.getLogger(__name__)

RANGED_READ_MIN = 256 * 1024


@dataclass(frozen=True, slots=True)
class CachedSegment:
    data: bytes
    bases: list[int]  # base offset of each batch
    positions: list[int]  # byte position of each batch in data
    headers: list[BatchHeader]

    @classmethod
    def parse(cls, data: bytes, key: str, verify: bool, expect: SegmentMeta | None = None) -> CachedSegment:
        """verify: check every CRC (header, batches, footer). expect: the committed metadata the object
        must match, so that an object replaced after its commit is refused rather than served."""
        reader = SegmentReader(data, key=key, verify=verify)
        info = reader.info
        if expect is not None and (info.base_offset, info.last_offset, info.size, info.crc) != (
                expect.base, expect.last, expect.size, expect.crc):
            raise CorruptSegmentError(
                f"segment object holds offsets {info.base_offset}..{info.last_offset} in {info.size} bytes"
                f" (crc {info.crc:#010x}), its commit says {expect.base}..{expect.last} in {expect.size}"
                f" bytes (crc {expect.crc:#010x})", key=key)
        return cls.of_batches(data, list(reader.batches()))

    @classmethod
    def of_batches(cls, data: bytes, found: list[tuple[int, BatchHeader]]) -> CachedSegment:
        return cls(data, [h.base_offset for _, h in found], [p for p, _ in found], [h for _, h in found])

    def slice_from(self, offset: int, max_bytes: int) -> bytes:
        """Whole batches from the one holding `offset` (in a compacted segment's gap: the next one); at least one
        batch, as Kafka does. Empty when the segment holds nothing at or after `offset`."""
        i = max(bisect.bisect_right(self.bases, offset) - 1, 0)
        if self.headers[i].last_offset < offset:
            i += 1
        if i == len(self.headers):
            return b""
        start = self.positions[i]
        end = start
        while i < len(self.headers):
            size = self.headers[i].size
            if end > start and end - start + size > max_bytes:
                break
            end += size
            i += 1
        return self.data[start:end]


class ReadPath:
    def __init__(self, owner: PartitionOwner, cache: ByteLRU) -> None:
        self.owner = owner
        self.cache = cache
        self._inflight: dict[tuple[int, int], asyncio.Task[CachedSegment]] = {}

    def _key(self, meta: SegmentMeta, kind: str = "seg") -> tuple[str, str, int, int, int]:
        """A segment's cache key. A cleaning rewrites segments at the same base: the pass tells them apart."""
        return (kind, self.owner.topic, self.owner.partition, meta.base, meta.cleaned)

    def discard(self, meta: SegmentMeta) -> None:
        """Forget a segment that is no longer committed (retention dropped it, a cleaning replaced it)."""
        self.cache.discard(self._key(meta))
        self.cache.discard(self._key(meta, "idx"))

    def _stored(self, meta: SegmentMeta) -> StoredAt:
        """Where the segment is: an object of its own, or (a virtual partition's) a range of a pack; every read
        below adds its start."""
        return meta.stored(self.owner.settings.namespace, self.owner.topic, self.owner.partition)

    async def _index_bytes(self, meta: SegmentMeta) -> tuple[bytes, str]:
        at, objects = self._stored(meta), self.owner.objects
        if at.index_size is None:
            return await objects.get(at.index_key), at.index_key
        return await objects.get_range(at.index_key, at.index_start, at.index_size), at.index_key

    def cache_built(self, meta: SegmentMeta, built: BuiltSegment) -> None:
        """Write-through after a flush: the tail a live consumer asks for next is already here.
        The builder already knows where every batch sits, so nothing is parsed again."""
        self.cache.put(self._key(meta), CachedSegment.of_batches(built.data, built.batches), len(built.data))

    def cached(self, offset: int) -> bool:
        """Whether a read at `offset` would be answered from memory, without an object store call."""
        meta = self.owner.segment_for(offset)
        return meta is not None and self._whole_segments(meta) and self._key(meta) in self.cache

    def _whole_segments(self, meta: SegmentMeta) -> bool:
        return meta.size <= max(self.cache.capacity // 8, 1)

    async def read(self, offset: int, max_bytes: int) -> bytes:
        """Committed record batches starting at the batch that holds `offset` (caller checked bounds), or at the
        next one when a cleaning removed it: a consumer inside a removed range moves on, as in Kafka."""
        while (meta := self.owner.segment_for(offset)) is not None:
            offset = max(offset, meta.base)
            if self._whole_segments(meta):
                seg = await self._load(meta)
                self._read_ahead(meta)
                found = seg.slice_from(offset, max_bytes)
            else:
                found = await self._ranged(meta, offset, max_bytes)
            if found:
                return found
            offset = meta.last + 1  # the rest of a compacted segment was removed
        return b""

    async def _load(self, meta: SegmentMeta) -> CachedSegment:
        cached = self.cache.get(self._key(meta))
        if cached is not None:
            return cached
        which = (meta.base, meta.cleaned)
        task = self._inflight.get(which)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._fetch_whole(meta))
            self._inflight[which] = task
            task.add_done_callback(lambda _t: self._inflight.pop(which, None))
        return await asyncio.shield(task)

    async def _fetch_whole(self, meta: SegmentMeta) -> CachedSegment:
        at = self._stored(meta)
        key = at.key
        data = await (self.owner.objects.get(key) if at.whole else self.owner.objects.get_range(key, at.start, at.size))
        seg = await asyncio.get_running_loop().run_in_executor(None, CachedSegment.parse, data, key, True, meta)
        self.cache.put(self._key(meta), seg, len(data))
        return seg

    def _read_ahead(self, meta: SegmentMeta) -> None:
        segments = self.owner.segments
        i = bisect.bisect_left(segments, meta.base, key=lambda s: s.base)
        for nxt in segments[i + 1 : i + 1 + self.owner.settings.readahead_segments]:
            which = (nxt.base, nxt.cleaned)
            if self._whole_segments(nxt) and self._key(nxt) not in self.cache and which not in self._inflight:
                task = asyncio.get_running_loop().create_task(self._fetch_whole(nxt))
                self._inflight[which] = task
                task.add_done_callback(self._readahead_done(which))

    def _readahead_done(self, which: tuple[int, int]) -> Any:
        def done(task: asyncio.Task[CachedSegment]) -> None:
            self._inflight.pop(which, None)
            if not task.cancelled() and task.exception() is not None:
                log.debug("read-ahead of segment %d failed: %s", which[0], task.exception())
        return done

    async def index(self, meta: SegmentMeta) -> SegmentIndex:
        key = self._key(meta, "idx")
        cached = self.cache.get(key)
        if cached is None:
            raw, where = await self._index_bytes(meta)
            cached = SegmentIndex.parse(raw, key=where)
            self.cache.put(key, cached, len(raw) + 64)
        return cached

    async def _ranged(self, meta: SegmentMeta, offset: int, max_bytes: int) -> bytes:
        """Whole batches from the one holding `offset`, by ranged GETs from the index entry at or below
        it; at least one batch even when it exceeds max_bytes. Every batch's CRC is checked and its
        offsets must follow on from the index entry (the batch CRC does not cover the base offset)."""
        index = await self.index(meta)
        stored = self._stored(meta)
        key = stored.key
        entry = index.entry_for(offset)
        pos, expected = entry.position, entry.offset
        end = meta.size - SEGMENT_FOOTER_SIZE
        want = max(max_bytes, RANGED_READ_MIN)
        out = bytearray()
        while pos < end:
            length = min(want, end - pos)
            chunk = memoryview(await self.owner.objects.get_range(key, stored.start + pos, length))
            if len(chunk) != length or length < LOG_OVERHEAD:
                raise CorruptSegmentError(f"segment shorter than committed: {len(chunk)} bytes at {pos}",
                                          key=key, position=pos)
            at = 0
            while at + LOG_OVERHEAD <= len(chunk):
                size = batch_size(chunk, at)
                if at + size > len(chunk):
                    break
                header = read_header(chunk, at, key=key)
                check_crc(chunk, at, header, key=key)
                if header.base_offset != expected and not (meta.cleaned and header.base_offset > expected):
                    raise CorruptSegmentError(f"batch starts at offset {header.base_offset}, expected {expected}",
                                              key=key, position=pos + at)
                expected = header.last_offset + 1
                if header.last_offset >= offset:
                    if out and len(out) + size > max_bytes:
                        return bytes(out)
                    out += chunk[at : at + size]
                at += size
            if out:
                return bytes(out)
            if at == 0:
                # The next batch is larger than what we read: ask for exactly that batch.
                size = batch_size(chunk)
                if pos + size > end:
                    raise CorruptSegmentError(f"batch of {size} bytes runs past the end of the segment",
                                              key=key, position=pos)
                want = size
                continue
            pos += at
            want = max(max_bytes, RANGED_READ_MIN)
        return bytes(out)

    async def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record whose timestamp is >= timestamp_ms."""
        from aiokafka.record.default_records import DefaultRecordBatch

        for meta in self.owner.segments:
            if meta.max_ts < timestamp_ms or meta.last < self.owner.log_start_offset:
                continue
            seg = await self._load(meta)
            for pos, header in zip(seg.positions, seg.headers, strict=True):
                if header.max_timestamp < timestamp_ms or header.last_offset < self.owner.log_start_offset:
                    continue
                batch = DefaultRecordBatch(seg.data[pos : pos + header.size])
                for record in batch:
                    if record.timestamp >= timestamp_ms and record.offset >= self.owner.log_start_offset:
                        return record.offset, record.timestamp
        return None

    async def max_timestamp_offset(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the record with the largest timestamp (ListOffsets -3)."""
        best: tuple[int, int] | None = None
        for meta in self.owner.segments:
            if best is None or meta.max_ts > best[1]:
                best = (meta.base, meta.max_ts)
        if best is None:
            return None
        return await self.offset_for_timestamp(best[1])

    def forget(self) -> None:
        o = self.owner
        self.cache.discard_where(lambda k: k[1] == o.topic and k[2] == o.partition)
