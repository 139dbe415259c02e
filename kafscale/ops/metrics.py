"""Prometheus metrics of one broker shard (one registry per shard, served on its own metrics port).

Hot-path hooks are a dictionary lookup plus a counter or histogram update per request, per append
and per flush: no per-record work (records are counted from batch headers). Figures that already
exist elsewhere (cache hits, S3 health, owners, high watermarks, consumer lag) are read when
Prometheus scrapes, by `_ShardCollector`, so they cost nothing in between.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from kafscale.broker.stats import CleanerFigures, ShardStats
from kafscale.protocol.schemas import api_name
from kafscale.storage.batch import count_records
from kafscale.storage.metadata_store import KeyValue, MetadataStore, Op, StoreStatus, TxnResult, WatchEvent

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SIZE_BUCKETS = tuple(float(1 << n) for n in range(10, 28, 2))  # 1 KiB .. 64 MiB


class PartitionMetrics:
    """What an owner reports; one per topic (shared by the topic's partitions on this shard)."""

    __slots__ = ("_bytes_in", "_flush_bytes", "_flush_seconds", "_records_in")

    def __init__(self, shard: ShardMetrics, topic: str) -> None:
        self._bytes_in = shard.bytes_in.labels(topic)
        self._records_in = shard.records_in.labels(topic)
        self._flush_bytes = shard.flush_bytes
        self._flush_seconds = shard.flush_seconds

    def flushed(self, batch_bytes: int, records: int, segment_bytes: int, seconds: float) -> None:
        """A segment committed. Produced bytes and records are counted here, once per segment rather than
        per Produce request (one per partition and linger from librdkafka): they count what is stored."""
        self._bytes_in.inc(batch_bytes)
        self._records_in.inc(records)
        self._flush_bytes.observe(segment_bytes)
        self._flush_seconds.observe(seconds)


class ShardMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.request_seconds = Histogram("kafscale_request_duration_seconds", "Kafka requests by API: latency",
                                         ["api"], registry=r, buckets=LATENCY_BUCKETS)
        self.connections_closed = Counter("kafscale_connections_closed", "Client connections the broker closed or "
                                          "refused, by reason", ["reason"], registry=r)
        self.bytes_in = Counter("kafscale_bytes_in", "Record batch bytes produced", ["topic"], registry=r)
        self.records_in = Counter("kafscale_records_in", "Records produced", ["topic"], registry=r)
        self.bytes_out = Counter("kafscale_bytes_out", "Record batch bytes fetched", ["topic"], registry=r)
        self.records_out = Counter("kafscale_records_out", "Records fetched (whole batches)", ["topic"], registry=r)
        self.flush_bytes = Histogram("kafscale_flush_size_bytes", "Segment size per flush", registry=r,
                                     buckets=SIZE_BUCKETS)
        self.flush_seconds = Histogram("kafscale_flush_duration_seconds", "Flush: upload and commit", registry=r,
                                       buckets=LATENCY_BUCKETS)
        self.s3_seconds = Histogram("kafscale_s3_request_duration_seconds", "Object store calls by operation",
                                    ["op"], registry=r, buckets=LATENCY_BUCKETS)
        self.s3_errors = Counter("kafscale_s3_request_errors", "Object store calls that failed", ["op"], registry=r)
        self.s3_requests = Counter("kafscale_object_store_requests", "Object store requests as S3 bills them (an "
                                   "upload of segment and index is 2 PUTs), by kind: put, get, head, list, delete",
                                   ["kind"], registry=r)
        self.meta_seconds = Histogram("kafscale_metadata_request_duration_seconds", "Metadata store calls",
                                      ["op"], registry=r, buckets=LATENCY_BUCKETS)
        self.meta_errors = Counter("kafscale_metadata_request_errors", "Metadata store calls that failed", ["op"],
                                   registry=r)
        self.orphans_deleted = Counter("kafscale_orphan_objects_deleted", "Objects no commit refers to or ever "
                                       "will, deleted by the janitor", registry=r)
        self.orphans_in_grace = Gauge("kafscale_orphan_objects_in_grace", "Such objects found by the janitor's last "
                                      "round but not yet past --orphan-grace-s", registry=r)
        self.snapshot_time = Gauge("kafscale_metadata_snapshot_timestamp_seconds", "When this shard last wrote a "
                                   "metadata snapshot (unix time; its age is time() minus this)", registry=r)
        self.snapshot_failures = Counter("kafscale_metadata_snapshot_failures", "Scheduled metadata snapshots "
                                         "that failed", registry=r)
        # The log cleaner (docs/compaction.md): per compacted partition, and per topic over its passes.
        part = ["topic", "partition"]
        self.cleaner_dirty_ratio = Gauge("kafscale_cleaner_dirty_ratio", "Dirty share of a compacted partition's "
                                         "cleanable bytes, as last assessed", part, registry=r)
        self.cleaner_dirty_bytes = Gauge("kafscale_cleaner_dirty_bytes", "Cleanable bytes not yet cleaned (the "
                                         "cleaner's lag)", part, registry=r)
        self.cleaner_delay = Gauge("kafscale_cleaner_max_compaction_delay_seconds", "How far past "
                                   "max.compaction.lag.ms the oldest dirty record is (Kafka's "
                                   "max-compaction-delay-secs)", part, registry=r)
        self.cleaner_read = Counter("kafscale_cleaner_read_bytes", "Bytes cleaning passes read", ["topic"],
                                    registry=r)
        self.cleaner_written = Counter("kafscale_cleaner_written_bytes", "Bytes cleaning passes wrote", ["topic"],
                                       registry=r)
        self.cleaner_reclaimed = Counter("kafscale_cleaner_reclaimed_bytes", "Committed bytes cleaning passes "
                                         "removed", ["topic"], registry=r)
        self.cleaner_removed = Counter("kafscale_cleaner_removed_records", "Records cleaning passes removed",
                                       ["topic"], registry=r)
        self.cleaner_seconds = Histogram("kafscale_cleaner_pass_duration_seconds", "One cleaning pass, from its "
                                         "first read to its commit", registry=r,
                                         buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800))
        self._requests: dict[int, Any] = {}
        self.requests = 0  # answered since start: the load meter's request rate
        self._topics: dict[str, PartitionMetrics] = {}
        self._out: dict[str, tuple[Any, Any]] = {}
        self._s3: dict[str, tuple[Any, Any, Any]] = {}

    # ---- hooks (hot path: keep them a lookup and an update)

    def connection_closed(self, reason: str) -> None:
        """The broker closed (or refused) a client connection: max_connections_per_ip, request_read_timeout,
        sasl_authentication_failed."""
        self.connections_closed.labels(reason).inc()

    def observe_request(self, api_key: int, seconds: float) -> None:
        self.requests += 1
        child = self._requests.get(api_key)
        if child is None:
            child = self._requests[api_key] = self.request_seconds.labels(api_name(api_key))
        child.observe(seconds)

    def partition(self, topic: str) -> PartitionMetrics:
        pm = self._topics.get(topic)
        if pm is None:
            pm = self._topics[topic] = PartitionMetrics(self, topic)
        return pm

    def fetched(self, topic: str, data: bytes) -> None:
        if not data:
            return
        pair = self._out.get(topic)
        if pair is None:
            pair = self._out[topic] = (self.bytes_out.labels(topic), self.records_out.labels(topic))
        pair[0].inc(len(data))
        pair[1].inc(count_records(data))

    def snapshot(self, created_ms: int | None) -> None:
        if created_ms is None:
            self.snapshot_failures.inc()
        else:
            self.snapshot_time.set(created_ms / 1000)

    def swept(self, deleted: int, in_grace: int) -> None:
        self.orphans_deleted.inc(deleted)
        self.orphans_in_grace.set(in_grace)

    def cleaner(self, f: CleanerFigures) -> None:
        labels = (f.topic, str(f.partition))
        self.cleaner_dirty_ratio.labels(*labels).set(f.dirty_ratio)
        self.cleaner_dirty_bytes.labels(*labels).set(f.dirty_bytes)
        self.cleaner_delay.labels(*labels).set(f.delay_s)
        if f.cleaned:
            self.cleaner_read.labels(f.topic).inc(f.bytes_read)
            self.cleaner_written.labels(f.topic).inc(f.bytes_written)
            self.cleaner_reclaimed.labels(f.topic).inc(max(f.bytes_reclaimed, 0))
            self.cleaner_removed.labels(f.topic).inc(f.records_removed)
            self.cleaner_seconds.observe(f.seconds)

    def observe_s3(self, op: str, seconds: float, ok: bool, kind: str, requests: int) -> None:
        children = self._s3.get(op)
        if children is None:
            children = self._s3[op] = (self.s3_seconds.labels(op), self.s3_errors.labels(op),
                                       self.s3_requests.labels(kind))
        children[0].observe(seconds)
        children[2].inc(requests)
        if not ok:
            children[1].inc()

    def watch(self, stats: Callable[[], ShardStats], connections: Callable[[], int],
              lags: Callable[[], Iterable[tuple[str, str, int, int]]]) -> None:
        """Expose the scrape-time figures: the shard's stats view, open connections, sampled consumer lag."""
        self.registry.register(_ShardCollector(stats, connections, lags))

    def names(self) -> set[str]:
        """Every metric family name this registry exposes (what dashboards may query)."""
        return {m.name for m in self.registry.collect()}


class _ShardCollector:
    """Scrape-time figures, read from the shard's stats view and the server's connection count."""

    def __init__(self, stats: Callable[[], ShardStats], connections: Callable[[], int],
                 lags: Callable[[], Iterable[tuple[str, str, int, int]]]) -> None:
        self.stats = stats
        self.connections = connections
        self.lags = lags

    def describe(self) -> Iterable[Metric]:
        return []  # computed at collect time; no fixed description needed

    def collect(self) -> Iterable[Metric]:
        s = self.stats()
        hits, misses = s.cache_hits, s.cache_misses
        yield CounterMetricFamily("kafscale_cache_hits", "Segment/index cache hits", value=hits)
        yield CounterMetricFamily("kafscale_cache_misses", "Segment/index cache misses", value=misses)
        yield GaugeMetricFamily("kafscale_cache_hit_ratio", "Cache hits / lookups since start",
                                value=hits / (hits + misses) if hits + misses else 0.0)
        yield GaugeMetricFamily("kafscale_cache_bytes", "Bytes held by the cache", value=s.cache_bytes)
        yield GaugeMetricFamily("kafscale_s3_health_state", "0 healthy, 1 degraded, 2 unavailable",
                                value=s.s3_state)
        yield GaugeMetricFamily("kafscale_shards", "Broker shards in the cluster", value=s.shards)
        yield GaugeMetricFamily("kafscale_partition_owners", "Partition owners hosted by this shard",
                                value=len(s.partitions))
        yield GaugeMetricFamily("kafscale_group_coordinators", "Group coordinators hosted by this shard",
                                value=s.group_coordinators)
        yield GaugeMetricFamily("kafscale_connections", "Open client connections", value=self.connections())
        yield GaugeMetricFamily("kafscale_fetch_sessions", "Incremental fetch sessions (KIP-227) cached",
                                value=s.fetch_sessions)
        yield GaugeMetricFamily("kafscale_fetch_session_partitions", "Partitions the cached fetch sessions hold",
                                value=s.fetch_session_partitions)
        yield CounterMetricFamily("kafscale_fetch_session_evictions", "Fetch sessions evicted to make room for new "
                                  "ones", value=s.fetch_session_evictions)
        hwm = GaugeMetricFamily("kafscale_partition_high_watermark", "End of committed data",
                                labels=["topic", "partition"])
        start = GaugeMetricFamily("kafscale_partition_log_start_offset", "First offset still kept",
                                  labels=["topic", "partition"])
        for p in s.partitions:
            hwm.add_metric([p.topic, str(p.partition)], p.high_watermark)
            start.add_metric([p.topic, str(p.partition)], p.log_start_offset)
        yield hwm
        yield start
        lag = GaugeMetricFamily("kafscale_consumer_lag", "High watermark minus committed offset",
                                labels=["group", "topic", "partition"])
        for group, topic, partition, value in self.lags():
            lag.add_metric([group, topic, str(partition)], value)
        yield lag


class TimedMetadataStore(MetadataStore):
    """The shard's metadata store with every call timed (watches are long-lived: passed through)."""

    def __init__(self, inner: MetadataStore, metrics: ShardMetrics) -> None:
        self.inner = inner
        self._children = {op: (metrics.meta_seconds.labels(op), metrics.meta_errors.labels(op))
                          for op in ("get", "range", "put", "delete", "txn", "revision", "lease")}

    async def _timed(self, op: str, call: Any) -> Any:
        seconds, errors = self._children[op]
        start = time.perf_counter()
        try:
            return await call
        except Exception:
            errors.inc()
            raise
        finally:
            seconds.observe(time.perf_counter() - start)

    async def get(self, key: str) -> KeyValue | None:
        return await self._timed("get", self.inner.get(key))

    async def range(self, prefix: str) -> list[KeyValue]:
        return await self._timed("range", self.inner.range(prefix))

    async def put(self, key: str, value: Any, lease: int = 0) -> int:
        return await self._timed("put", self.inner.put(key, value, lease))

    async def delete(self, key: str, prefix: bool = False) -> int:
        return await self._timed("delete", self.inner.delete(key, prefix))

    async def txn(self, compares: Sequence[Any], success: Sequence[Op], failure: Sequence[Op] = ()) -> TxnResult:
        return await self._timed("txn", self.inner.txn(compares, success, failure))

    async def revision(self) -> int:
        return await self._timed("revision", self.inner.revision())

    async def lease_grant(self, ttl_seconds: float) -> int:
        return await self._timed("lease", self.inner.lease_grant(ttl_seconds))

    async def lease_keepalive(self, lease_id: int) -> bool:
        return await self._timed("lease", self.inner.lease_keepalive(lease_id))

    async def lease_revoke(self, lease_id: int) -> None:
        await self._timed("lease", self.inner.lease_revoke(lease_id))

    def watch(self, prefix: str, start_revision: int = 0) -> AsyncIterator[WatchEvent]:
        return self.inner.watch(prefix, start_revision)

    async def compact(self, revision: int) -> None:
        await self.inner.compact(revision)

    async def status(self) -> StoreStatus:
        return await self.inner.status()

    async def compare_and_swap(self, key: str, expected_mod_revision: int, value: Any) -> bool:
        return await self._timed("txn", self.inner.compare_and_swap(key, expected_mod_revision, value))

    async def close(self) -> None:
        await self.inner.close()

