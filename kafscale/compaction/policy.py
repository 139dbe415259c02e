"""When a compacted partition is cleaned, and how far: Kafka's rules over Kafscale's segment list.

- Cleanable: the committed segments from the log start up to the first one that must not be touched yet: one
  reaching the last stable offset (an open transaction's records are not decided), or one holding a record younger
  than `min.compaction.lag.ms`. Every committed segment is closed (a flush never appends to one), so there is no
  active segment to wait for and `segment.ms` has nothing to roll.
- Dirty: the cleanable segments at or past the cleaner's checkpoint (the end of what the last pass mapped).
- A partition is due when its dirty share of the cleanable bytes reaches `min.cleanable.dirty.ratio`, or when its
  oldest dirty record is older than `max.compaction.lag.ms` (then whatever the ratio).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kafscale.cluster.records import SegmentMeta
from kafscale.cluster.topic_configs import DEFAULTS, policies


@dataclass(frozen=True, slots=True)
class CompactionConfig:
    compact: bool
    min_dirty_ratio: float
    min_lag_ms: int
    max_lag_ms: int
    delete_retention_ms: int
    segment_bytes: int

    @classmethod
    def of_topic(cls, configs: Mapping[str, Any], segment_bytes: int) -> CompactionConfig:
        def get(name: str) -> str:
            return str(configs.get(name, DEFAULTS[name]))

        return cls("compact" in policies(dict(configs)), float(get("min.cleanable.dirty.ratio")),
                   int(get("min.compaction.lag.ms")), int(get("max.compaction.lag.ms")),
                   int(get("delete.retention.ms")), int(configs.get("segment.bytes", segment_bytes)))


@dataclass(frozen=True, slots=True)
class Plan:
    segments: tuple[SegmentMeta, ...]  # the cleanable segments, from the log start
    first_dirty: int
    dirty_bytes: int
    total_bytes: int
    forced: bool  # due by max.compaction.lag.ms, not by the ratio
    oldest_dirty_ms: int  # the oldest dirty record's timestamp (now when nothing is dirty)

    @property
    def dirty_ratio(self) -> float:
        return self.dirty_bytes / self.total_bytes if self.total_bytes else 0.0


def cleanable(segments: Sequence[SegmentMeta], log_start: int, stable_end: int, now_ms: int,
              config: CompactionConfig) -> list[SegmentMeta]:
    out = []
    for s in segments:
        if s.last < log_start:
            continue
        newest = s.max_ts if s.max_ts >= 0 else s.created_ms
        if s.last >= stable_end or newest > now_ms - config.min_lag_ms:
            break
        out.append(s)
    return out


def plan(segments: Sequence[SegmentMeta], log_start: int, first_dirty: int, stable_end: int, now_ms: int,
         config: CompactionConfig) -> Plan:
    """What a pass would clean now, and the figures that say whether it is due (`due`)."""
    part = cleanable(segments, log_start, stable_end, now_ms, config)
    dirty = [s for s in part if s.last >= first_dirty]
    oldest = min((s.min_ts if s.min_ts >= 0 else s.created_ms for s in dirty), default=now_ms)
    forced = bool(dirty) and oldest < now_ms - config.max_lag_ms
    return Plan(tuple(part), first_dirty, sum(s.size for s in dirty), sum(s.size for s in part), forced, oldest)


def due(p: Plan, config: CompactionConfig) -> bool:
    return config.compact and p.dirty_bytes > 0 and (p.forced or p.dirty_ratio >= config.min_dirty_ratio)
