"""From options and the committed state to offset ranges per partition, and from those to Spark slices.

Offsets use the JSON form of Spark's Kafka source: ``{"orders": {"0": 23, "1": -2}}`` where -2 means
earliest and -1 latest. Ranges are always clamped to what is durably committed: the high watermark is
the end of every range, whatever a caller asks for. Under read_committed (the default, option
``kafka.isolation.level``) the end is the last stable offset instead, and each slice carries the aborted
transactions that overlap it, so that the executor drops their batches.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from kafscale.cluster.records import AbortedTxn, SegmentMeta
from kafscale.pipeline.committed import PartitionLog, Snapshot, TopicMeta, read_snapshot
from kafscale.pipeline.location import Location, objects_for
from kafscale.pipeline.slices import DataLossError, Slice, read_slice
from kafscale.storage.index import SegmentIndex
from kafscale.storage.segment import SEGMENT_FOOTER_SIZE

__all__ = ["READ_COMMITTED", "READ_UNCOMMITTED", "Offsets", "SourceOptions", "isolation_level", "overlapping_aborted",
           "plan_slices", "resolve_offsets"]

EARLIEST, LATEST = -2, -1
READ_COMMITTED, READ_UNCOMMITTED = "read_committed", "read_uncommitted"
# Spark's Kafka source passes kafka.* to its consumer, so kafka.isolation.level is its name there; isolationLevel
# is the same in the camel case of this source's own options.
_ISOLATION_OPTIONS = ("kafka.isolation.level", "isolationlevel")
Offsets = dict[str, dict[str, int]]  # topic -> partition (as a string, like Spark's JSON) -> offset


def _flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name)
    return default if raw is None else str(raw).strip().lower() in ("1", "true", "yes", "on")


def include_headers(options: Mapping[str, str]) -> bool:
    """Spark's Kafka source option includeHeaders; here the headers column is there unless it is "false"."""
    return _flag({str(k).lower(): v for k, v in options.items()}, "includeheaders", True)


def isolation_level(options: Mapping[str, str]) -> str:
    """read_committed (the default, as the issue asks; Kafka consumers default to read_uncommitted) or
    read_uncommitted, from kafka.isolation.level or isolationLevel (case-insensitive names and values)."""
    opts = {str(k).lower(): str(v).strip().lower() for k, v in options.items()}
    given = {opts[name] for name in _ISOLATION_OPTIONS if name in opts}
    if len(given) > 1:
        raise ValueError("kafka.isolation.level and isolationLevel disagree: give one of them")
    level = given.pop() if given else READ_COMMITTED
    if level not in (READ_COMMITTED, READ_UNCOMMITTED):
        raise ValueError(f"kafka.isolation.level: expected read_committed or read_uncommitted, got {level!r}")
    return level


@dataclass(frozen=True)
class SourceOptions:
    location: Location
    topics: list[str] | None
    pattern: str | None
    starting: str = "earliest"
    ending: str = "latest"
    starting_timestamp: int | None = None
    fail_on_data_loss: bool = True
    max_offsets_per_trigger: int | None = None
    split_bytes: int = 64 * 1024 * 1024
    max_partition_bytes: int = 32 * 1024 * 1024
    min_partitions: int | None = None
    data_loss_dir: str = ""
    include_headers: bool = True
    isolation_level: str = READ_COMMITTED
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def read_committed(self) -> bool:
        return self.isolation_level == READ_COMMITTED

    def visible_end(self, part: PartitionLog) -> int:
        """Where reads of a partition stop: its last stable offset under read_committed, else its high
        watermark."""
        return part.visible_end(self.read_committed)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        chosen = [k for k in ("topic", "topics", "subscribe", "topicpattern", "subscribepattern") if k in opts]
        if len(chosen) != 1:
            raise ValueError("give exactly one of the options topic, topics or topicPattern")
        topics = pattern = None
        if chosen[0] in ("topicpattern", "subscribepattern"):
            pattern = opts[chosen[0]]
        else:
            topics = [t.strip() for t in opts[chosen[0]].split(",") if t.strip()]
        max_offsets = opts.get("maxoffsetspertrigger")
        ts = opts.get("startingtimestamp")
        return cls(
            location=Location.from_options(opts),
            topics=topics,
            pattern=pattern,
            starting=opts.get("startingoffsets", "earliest"),
            ending=opts.get("endingoffsets", "latest"),
            starting_timestamp=int(ts) if ts else None,
            fail_on_data_loss=_flag(opts, "failondataloss", True),
            max_offsets_per_trigger=int(max_offsets) if max_offsets else None,
            split_bytes=int(opts.get("kafscale.split.bytes", 64 * 1024 * 1024)),
            max_partition_bytes=int(opts.get("kafscale.maxpartitionbytes", 32 * 1024 * 1024)),
            min_partitions=int(opts["minpartitions"]) if opts.get("minpartitions") else None,
            data_loss_dir=opts.get("kafscale.datalossdir", ""),
            include_headers=include_headers(opts),
            isolation_level=isolation_level(opts),
        )

    def snapshot(self) -> Snapshot:
        return read_snapshot(self.location, topics=self.topics, pattern=self.pattern)


def resolve_offsets(opts: SourceOptions, snap: Snapshot, spec: str, *,
                    ending: bool = False) -> dict[tuple[str, int], int]:
    """Concrete offsets for every partition of the snapshot from "earliest", "latest" or JSON."""
    out: dict[tuple[str, int], int] = {}
    given: Mapping[str, Mapping[str, int]] = {}
    text = spec.strip()
    if text.startswith("{"):
        given = json.loads(text)
        unknown = [t for t in given if t not in snap.topics]
        if unknown:
            raise ValueError(f"offsets given for topics not read by this query: {unknown}")
    elif text not in ("earliest", "latest"):
        raise ValueError(f"{'endingOffsets' if ending else 'startingOffsets'}: expected earliest, latest or JSON,"
                         f" got {spec!r}")
    default = LATEST if ending or text == "latest" else EARLIEST
    for (topic, p), part in snap.logs.items():
        wanted = int(given.get(topic, {}).get(str(p), default))
        if wanted == EARLIEST:
            if ending:
                raise ValueError("endingOffsets cannot be earliest (-2)")
            wanted = part.log_start
        elif wanted == LATEST:
            wanted = opts.visible_end(part)
        elif wanted < part.log_start:
            if opts.fail_on_data_loss:
                raise DataLossError(f"offset {wanted} of {topic}-{p} is gone: the log starts at {part.log_start}")
            wanted = part.log_start
        out[(topic, p)] = min(wanted, opts.visible_end(part))
    return out


def timestamp_offsets(opts: SourceOptions, snap: Snapshot, timestamp_ms: int) -> dict[tuple[str, int], int]:
    """First offset whose record timestamp is >= timestamp_ms, per partition; the end (the high watermark, or
    the last stable offset under read_committed) when none is (Kafka's ListOffsets by time). Segment metadata
    says which segment to decode: the first whose max_ts reaches the timestamp. Under read_committed aborted
    records are not candidates."""
    out: dict[tuple[str, int], int] = {}
    for tp, part in snap.logs.items():
        end = out[tp] = opts.visible_end(part)
        for seg in part.segments:
            if seg.base >= end:
                break
            if seg.max_ts < timestamp_ms:
                continue
            piece = _slice(opts, part, seg, part.log_start, end, None, timestamp_ms)
            found = None
            for batch in read_slice(piece):
                ts = batch.column("timestamp").cast("int64").to_numpy() // 1000
                offsets = batch.column("offset").to_numpy()
                hits = (ts >= timestamp_ms).nonzero()[0]
                if len(hits):
                    found = int(offsets[hits[0]])
                    break
            if found is not None:
                out[tp] = found
                break
    return out


def starting_offsets(opts: SourceOptions, snap: Snapshot) -> dict[tuple[str, int], int]:
    if opts.starting_timestamp is not None:
        return timestamp_offsets(opts, snap, opts.starting_timestamp)
    return resolve_offsets(opts, snap, opts.starting)


def plan_slices(opts: SourceOptions, snap: Snapshot, start: Mapping[tuple[str, int], int],
                end: Mapping[tuple[str, int], int], *, min_timestamp: int | None = None,
                max_timestamp: int | None = None) -> list[Slice]:
    """One slice per committed segment overlapping [start, end) of each partition, or per byte range of a
    segment larger than split_bytes. Segments entirely before min_timestamp (by their max_ts) or, on
    LogAppendTime topics, entirely after max_timestamp are pruned."""
    slices: list[Slice] = []
    for tp in sorted(end):
        part = snap.logs[tp]
        lo, hi = start.get(tp, part.log_start), end[tp]
        if lo >= hi:
            continue
        _check_coverage(opts, part, lo, hi)
        topic_meta = snap.topics[part.topic]
        for seg in part.segments:
            if seg.last < lo or seg.base >= hi:
                continue
            if min_timestamp is not None and seg.max_ts < min_timestamp:
                continue
            if max_timestamp is not None and _starts_after(topic_meta, seg.min_ts, max_timestamp):
                continue
            if seg.size <= opts.split_bytes:
                slices.append(_slice(opts, part, seg, lo, hi, None, min_timestamp))
                continue
            for byte_range in _ranges(opts, part, seg, lo, hi):
                slices.append(_slice(opts, part, seg, lo, hi, byte_range, min_timestamp))
    return slices


def group_slices(opts: SourceOptions, slices: list[Slice]) -> list[tuple[Slice, ...]]:
    """Consecutive slices packed into Spark input partitions of at most max_partition_bytes (a larger slice is
    one on its own), as Spark packs small files: each task costs tens of milliseconds whatever it reads, as
    much as decoding a 4 MiB segment. minPartitions (as in Spark's Kafka source) shrinks the budget so that
    there are at least that many partitions while slices allow."""
    budget = opts.max_partition_bytes
    if opts.min_partitions:
        budget = min(budget, max(1, sum(s.nbytes for s in slices) // opts.min_partitions))
    groups: list[list[Slice]] = []
    size = 0
    for piece in slices:
        if not groups or size + piece.nbytes > budget:
            groups.append([])
            size = 0
        groups[-1].append(piece)
        size += piece.nbytes
    return [tuple(g) for g in groups]


def _starts_after(topic: TopicMeta, segment_min_ts: int, max_timestamp: int) -> bool:
    # Only sound for LogAppendTime: there every record carries its batch's maxTimestamp, so the segment's
    # smallest batch maxTimestamp is its smallest record timestamp. Under CreateTime a batch may hold
    # records far older than its maxTimestamp, and nothing in the metadata bounds them from below.
    return topic.log_append_time and segment_min_ts > max_timestamp


def _slice(opts: SourceOptions, part: PartitionLog, seg: SegmentMeta, lo: int, hi: int,
           byte_range: tuple[int, int, int] | None, min_timestamp: int | None) -> Slice:
    start = max(lo, part.log_start)
    # Only what the slice's own offsets need: a transactional batch is dropped by its producer's ranges.
    aborted = (overlapping_aborted(part.aborted, max(start, seg.base), min(hi, seg.last + 1))
               if opts.read_committed else ())
    return Slice(opts.location, part.topic, part.partition, seg, start, hi, byte_range,
                 min_timestamp, opts.fail_on_data_loss, opts.data_loss_dir, aborted)


def overlapping_aborted(aborted: tuple[AbortedTxn, ...], lo: int, hi: int) -> tuple[AbortedTxn, ...]:
    """The aborted transactions with records in [lo, hi): all a slice of those offsets needs to know."""
    return tuple(a for a in aborted if a.first_offset < hi and a.last_offset >= lo)


def _ranges(opts: SourceOptions, part: PartitionLog, seg: SegmentMeta, lo: int, hi: int) -> list[tuple[int, int, int]]:
    """Byte ranges of about split_bytes between index entries (always batch boundaries)."""
    objects = objects_for(opts.location)
    at = seg.stored(opts.location.namespace, part.topic, part.partition)
    key = at.index_key
    raw = objects.get(key) if at.index_size is None else objects.get_range(key, at.index_start, at.index_size)
    index = SegmentIndex.parse(raw, key=key)
    body_end = seg.size - SEGMENT_FOOTER_SIZE
    cuts = [index.entries[0]]
    for entry in index.entries[1:]:
        if entry.position - cuts[-1].position >= opts.split_bytes:
            cuts.append(entry)
    out = []
    for i, cut in enumerate(cuts):
        stop_pos = cuts[i + 1].position if i + 1 < len(cuts) else body_end
        stop_offset = cuts[i + 1].offset if i + 1 < len(cuts) else seg.last + 1
        if stop_offset > lo and cut.offset < hi:
            out.append((cut.position, stop_pos, cut.offset))
    return out


def _check_coverage(opts: SourceOptions, part: PartitionLog, lo: int, hi: int) -> None:
    """Committed segments must cover [lo, hi) without holes; a hole is data loss."""
    expected = lo
    for seg in part.segments:
        if seg.last < lo or seg.base >= hi:
            continue
        if seg.base > expected:
            break
        expected = seg.last + 1
    if expected < hi and opts.fail_on_data_loss:
        raise DataLossError(f"offsets {expected}..{hi - 1} of {part.topic}-{part.partition} have no committed"
                            " segment (set failOnDataLoss=false to read around the hole)")
