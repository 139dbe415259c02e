"""One cleaning pass over a partition's cleanable segments: Kafka's log cleaner, on objects.

1. Map: from the checkpoint on, each key's latest offset (`KeyMap`), until the map is full or the dirty part ends.
   Aborted transactional records and markers are not mapped: they never win over a committed value.
2. Rewrite: every cleanable segment below where the map stopped, in groups of up to `segment.bytes`, keeping:
   - a record whose offset is its key's latest (or whose key the map does not know: a newer value, if any, lies
     past the map); never a record without a key;
   - a tombstone until its batch's delete horizon (KIP-534) has passed; a batch that keeps a tombstone and has no
     horizon yet gets one, now + `delete.retention.ms`;
   - no record of an aborted transaction;
   - a transaction marker while its transaction still has batches here (kept or just removed: Kafka's cleaner
     counts what it saw), then until its own horizon, set by the first pass that sees none.
   Offsets never change: a kept batch keeps its base offset and offset range, and a segment keeps its span.
3. The caller commits the new segments in place of the old ones (kafscale.broker.cleaning).

Pure apart from the `read` and `write` it is given, so it runs wherever there is a CPU: a worker thread, a Ray task.
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kafscale.cluster.records import AbortedTxn, SegmentMeta
from kafscale.compaction.keymap import KeyMap
from kafscale.compaction.records import as_record, decoded, emptied, keys_and_offsets, rebuild, records_of
from kafscale.storage.batch import BatchHeader, split_batches
from kafscale.storage.segment import batches_region, build_segment


@dataclass(frozen=True, slots=True)
class Job:
    namespace: str
    topic: str
    partition: int
    epoch: int  # the owner's: the new objects' keys, and what fences its commit
    cleaning: int  # this pass's id, unique for the partition: the new objects' keys
    segments: tuple[SegmentMeta, ...]  # the cleanable segments, in offset order
    first_dirty: int
    aborted: tuple[AbortedTxn, ...]  # the partition's aborted transactions
    now_ms: int
    delete_retention_ms: int
    segment_bytes: int
    map_entries: int
    index_interval_bytes: int = 4096


@dataclass(frozen=True, slots=True)
class Replacement:
    """`old` (consecutive segments) become `new`, which spans the same offsets."""

    old: tuple[SegmentMeta, ...]
    new: SegmentMeta


@dataclass(slots=True)
class Stats:
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_removed: int = 0
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Outcome:
    replacements: tuple[Replacement, ...]  # only the groups that changed
    cleaned_to: int  # the new checkpoint: where the map stopped
    stats: Stats = field(default_factory=Stats)


Read = Callable[[SegmentMeta], bytes]  # a segment's whole object bytes
Write = Callable[[str, bytes], None]  # a new object


def clean(job: Job, read: Read, write: Write) -> Outcome:
    started = time.monotonic()
    stats = Stats()
    aborted = _Aborted(job.aborted)
    keymap, cleaned_to = _map(job, read, aborted, stats)
    replacements = []
    txn_seen: dict[int, bool] = {}  # producer id -> this pass saw a batch of its current transaction
    for group in _groups([s for s in job.segments if s.base < cleaned_to], job.segment_bytes):
        r = _rewrite(job, group, read, write, keymap, aborted, txn_seen, stats)
        if r is not None:
            replacements.append(r)
    stats.seconds = time.monotonic() - started
    return Outcome(tuple(replacements), cleaned_to, stats)


class _Aborted:
    """Which transactional batches an abort marker undid: (producer id, offset) inside an aborted range."""

    def __init__(self, aborted: Sequence[AbortedTxn]) -> None:
        self._by_pid: dict[int, list[AbortedTxn]] = {}
        for a in sorted(aborted, key=lambda a: a.first_offset):
            self._by_pid.setdefault(a.producer_id, []).append(a)
        self._firsts = {pid: [a.first_offset for a in txns] for pid, txns in self._by_pid.items()}

    def covers(self, producer_id: int, offset: int) -> bool:
        txns = self._by_pid.get(producer_id)
        if txns is None:
            return False
        i = bisect.bisect_right(self._firsts[producer_id], offset) - 1
        return i >= 0 and offset <= txns[i].last_offset


def _batches(data: bytes, key: str) -> list[tuple[int, BatchHeader]]:
    start, end = batches_region(len(data))
    return [(start + pos, h) for pos, h in split_batches(memoryview(data)[start:end], verify_crc=True, key=key)]


def _aborted_data(h: BatchHeader, aborted: _Aborted) -> bool:
    return h.is_transactional and not h.is_control and aborted.covers(h.producer_id, h.base_offset)


def _map(job: Job, read: Read, aborted: _Aborted, stats: Stats) -> tuple[KeyMap, int]:
    keymap = KeyMap(job.map_entries)
    cleaned_to = job.first_dirty
    for seg in job.segments:
        if seg.last < job.first_dirty:
            continue
        data = read(seg)
        stats.bytes_read += len(data)
        for pos, h in _batches(data, f"{job.topic}-{job.partition}@{seg.base}"):
            if h.last_offset < job.first_dirty:
                continue
            if not h.is_control and not _aborted_data(h, aborted):
                found = [(k, o) for k, o in keys_and_offsets(data[pos : pos + h.size], h) if k is not None]
                if not keymap.room_for([k for k, _ in found]):
                    if cleaned_to <= job.first_dirty:
                        raise ValueError(f"--compaction-map-entries {job.map_entries} cannot hold the {len(found)}"
                                         f" keys of one batch of {job.topic}-{job.partition}")
                    return keymap, cleaned_to
                keymap.put_all(found)  # type: ignore[arg-type]
            cleaned_to = h.last_offset + 1
        cleaned_to = max(cleaned_to, seg.last + 1)
    return keymap, cleaned_to


def _groups(segments: list[SegmentMeta], limit: int) -> list[list[SegmentMeta]]:
    groups: list[list[SegmentMeta]] = []
    size = 0
    for s in segments:
        if groups and size + s.size <= limit:
            groups[-1].append(s)
            size += s.size
        else:
            groups.append([s])
            size = s.size
    return groups


def _rewrite(job: Job, group: list[SegmentMeta], read: Read, write: Write, keymap: KeyMap, aborted: _Aborted,
             txn_seen: dict[int, bool], stats: Stats) -> Replacement | None:
    out: list[bytes] = []
    changed = len(group) > 1  # merging segments is worth a rewrite by itself: fewer, larger objects
    for seg in group:
        data = read(seg)
        stats.bytes_read += len(data)
        for pos, h in _batches(data, f"{job.topic}-{job.partition}@{seg.base}"):
            raw = data[pos : pos + h.size]
            kept = _filter(job, h, raw, keymap, aborted, txn_seen, stats)
            if kept is not raw:
                changed = True
            if kept:
                out.append(kept)
            last = h
    if not changed:
        return None
    if not out:
        # Nothing kept: the group's last batch, emptied, holds its span. The log stays without holes (a hole reads
        # as lost data), and a consumer's position moves past the span, as past Kafka's emptied batches.
        out.append(emptied(last))
    built = build_segment(out, created_ms=job.now_ms, index_interval_bytes=job.index_interval_bytes,
                          span=(group[0].base, group[-1].last))
    markers = {h.base_offset for _, h in built.batches if h.is_control}
    meta = dataclasses.replace(
        SegmentMeta.from_info(built.info, job.epoch,
                              aborted=tuple(a for s in group for a in s.aborted if a.last_offset in markers)),
        cleaned=job.cleaning)
    at = meta.stored(job.namespace, job.topic, job.partition)
    write(at.key, built.data)
    write(at.index_key, built.index)
    stats.bytes_written += len(built.data) + len(built.index)
    return Replacement(tuple(group), meta)


def _filter(job: Job, h: BatchHeader, raw: bytes, keymap: KeyMap, aborted: _Aborted, txn_seen: dict[int, bool],
            stats: Stats) -> bytes:
    """What of one batch stays: `raw` itself when all of it, b"" when none, else the rebuilt batch."""
    horizon = h.delete_horizon_ms
    if h.is_control:
        if txn_seen.pop(h.producer_id, False):
            return raw  # its transaction still had batches here: a reader may need the marker to decide them
        if horizon is None:
            return rebuild(h, records_of(raw, h), horizon_ms=job.now_ms + job.delete_retention_ms)
        return raw if horizon > job.now_ms else b""
    records = decoded(raw, h)  # aiokafka's records: a Record is made only of what a rebuild keeps
    stats.records_read += len(records)
    if h.is_transactional:
        txn_seen[h.producer_id] = True
    if _aborted_data(h, aborted):
        stats.records_removed += len(records)
        return b""
    kept = []
    tombstones = False
    latest = keymap.lookup
    for r in records:
        key = r.key
        if key is None:
            continue  # Kafka's cleaner drops what has no key: it cannot be compacted
        newest = latest(key)
        if newest is not None and r.offset < newest:
            continue  # a newer value of the key follows
        if r.value is None:
            if horizon is not None and horizon <= job.now_ms:
                continue  # kept for delete.retention.ms after the cleaning that first kept it: done
            tombstones = True
        kept.append(r)
    stats.records_removed += len(records) - len(kept)
    if not kept:
        return b""
    if len(kept) == len(records) and not (tombstones and horizon is None):
        return raw
    if tombstones and horizon is None:
        horizon = job.now_ms + job.delete_retention_ms
    return rebuild(h, [as_record(r, h.base_offset) for r in kept], horizon_ms=horizon)
    return rebuild(h, kept, horizon_ms=horizon)
