"""What the broker core tells operations, without knowing who listens.

The core reports through a `BrokerMetrics` sink that the shard's composition hands it (kafscale.ops.metrics
implements it with Prometheus; `NO_METRICS` reports nothing), and answers `ShardCore.stats()` with a
`ShardStats` snapshot that operations read when they need figures (a scrape, a lag sample, a status call).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class PartitionSink(Protocol):
    def flushed(self, batch_bytes: int, records: int, segment_bytes: int, seconds: float) -> None: ...


class BrokerMetrics(Protocol):
    """Hooks on the data path: each must cost a lookup and a counter update, no more."""

    def partition(self, topic: str) -> PartitionSink: ...

    def fetched(self, topic: str, data: bytes) -> None: ...

    def observe_s3(self, op: str, seconds: float, ok: bool, kind: str, requests: int) -> None: ...

    def swept(self, deleted: int, in_grace: int) -> None:
        """A janitor round: garbage objects deleted, and found but not yet old enough to delete."""

    def snapshot(self, created_ms: int | None) -> None:
        """A scheduled metadata snapshot was taken at created_ms, or (None) failed."""

    def cleaner(self, figures: CleanerFigures) -> None:
        """A compacted partition was assessed, and cleaned if `figures.cleaned`."""


@dataclass(frozen=True, slots=True)
class CleanerFigures:
    """One compacted partition as the cleaner last saw it, and what its pass did (zeros when it did not run)."""

    topic: str
    partition: int
    dirty_ratio: float
    dirty_bytes: int  # the cleaner's lag: what the next pass has to map
    delay_s: float  # Kafka's max-compaction-delay-secs: how far past max.compaction.lag.ms its oldest dirty record is
    cleaned: bool = False
    bytes_read: int = 0
    bytes_written: int = 0
    bytes_reclaimed: int = 0  # committed bytes before the pass minus after
    records_removed: int = 0
    seconds: float = 0.0


class _NoPartition:
    def flushed(self, batch_bytes: int, records: int, segment_bytes: int, seconds: float) -> None:
        pass


class _NoMetrics:
    _partition = _NoPartition()

    def partition(self, topic: str) -> PartitionSink:
        return self._partition

    def fetched(self, topic: str, data: bytes) -> None:
        pass

    def observe_s3(self, op: str, seconds: float, ok: bool, kind: str, requests: int) -> None:
        pass

    def swept(self, deleted: int, in_grace: int) -> None:
        pass

    def snapshot(self, created_ms: int | None) -> None:
        pass

    def cleaner(self, figures: CleanerFigures) -> None:
        pass


NO_METRICS: BrokerMetrics = _NoMetrics()


@dataclass(frozen=True, slots=True)
class PartitionStats:
    topic: str
    partition: int
    high_watermark: int
    log_start_offset: int
    bytes_in: int = 0  # record batch bytes appended since its owner opened here
    bytes_out: int = 0  # record batch bytes served since its owner opened here
    unit: int = -1  # the physical partition it moves with (a virtual partition's); -1: the partition itself


@dataclass(frozen=True, slots=True)
class ShardStats:
    shard_id: int
    shards: int  # shards in the cluster
    cache_hits: int
    cache_misses: int
    cache_bytes: int
    s3_state: int  # kafscale.storage.health.HealthState: 0 healthy, 1 degraded, 2 unavailable
    group_coordinators: int
    partitions: tuple[PartitionStats, ...]  # the partition owners open here
    fetch_sessions: int = 0  # incremental fetch sessions (KIP-227) cached
    fetch_session_partitions: int = 0  # partitions those sessions hold
    fetch_session_evictions: int = 0  # sessions evicted to make room, since start
