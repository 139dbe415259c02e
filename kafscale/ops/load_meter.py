"""A shard's load, sampled on a timer off the data path: what the controller scales and balances by.

The data path only adds to counters it already holds (an owner's bytes in and out, the requests answered);
every LOAD_INTERVAL_S this turns their growth, and the process's CPU time, into rates. The controller reads
the latest sample with one Ray call per shard per round, never per request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

from prometheus_client.core import GaugeMetricFamily, Metric

from kafscale.broker.stats import ShardStats
from kafscale.cluster.load import PartitionLoad, ShardLoad

LOAD_INTERVAL_S = 2.0


class LoadMeter:
    def __init__(self, shard_id: int, stats: Callable[[], ShardStats], requests: Callable[[], int],
                 cpus: float = 1.0, *, clock: Callable[[], float] = time.monotonic,
                 cpu_clock: Callable[[], float] = time.process_time) -> None:
        self.shard_id = shard_id
        self._stats = stats
        self._requests = requests
        self._cpus = max(cpus, 1.0)  # a shard's one event loop uses at most one core, whatever it asked Ray for
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._at = clock()
        self._cpu = cpu_clock()
        self._requests_seen = requests()
        self._bytes: dict[tuple[str, int], tuple[int, int]] = {}
        self.latest = ShardLoad(shard_id, 0.0, 0.0, 0.0, 0.0, 0.0)

    def sample(self) -> ShardLoad:
        """Rates since the previous sample (an owner opened meanwhile counts from zero)."""
        now, cpu, requests = self._clock(), self._cpu_clock(), self._requests()
        elapsed = max(now - self._at, 1e-6)
        rates: dict[tuple[str, int], tuple[float, float]] = {}
        seen: dict[tuple[str, int], tuple[int, int]] = {}
        for p in self._stats().partitions:
            key = (p.topic, p.partition)
            before_in, before_out = self._bytes.get(key, (0, 0))
            if p.bytes_in < before_in or p.bytes_out < before_out:  # a new owner: its counters restarted
                before_in = before_out = 0
            seen[key] = (p.bytes_in, p.bytes_out)
            # By what moves: a physical partition's virtual partitions are one load, as they are one move.
            unit = (p.topic, p.unit if p.unit >= 0 else p.partition)
            rate_in, rate_out = rates.get(unit, (0.0, 0.0))
            rates[unit] = (rate_in + (p.bytes_in - before_in) / elapsed,
                           rate_out + (p.bytes_out - before_out) / elapsed)
        parts = [PartitionLoad(t, u, rate_in, rate_out) for (t, u), (rate_in, rate_out) in rates.items()]
        self.latest = ShardLoad(
            shard_id=self.shard_id, busy=(cpu - self._cpu) / elapsed / self._cpus,
            bytes_in=sum(p.bytes_in for p in parts), bytes_out=sum(p.bytes_out for p in parts),
            requests=(requests - self._requests_seen) / elapsed, interval_s=elapsed, partitions=tuple(parts))
        self._at, self._cpu, self._requests_seen, self._bytes = now, cpu, requests, seen
        return self.latest

    async def run(self, interval_s: float = LOAD_INTERVAL_S) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.sample()


class LoadCollector:
    """The latest sample as Prometheus gauges (read at scrape time, like the shard's other figures)."""

    def __init__(self, meter: LoadMeter) -> None:
        self.meter = meter

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        load = self.meter.latest
        yield GaugeMetricFamily("kafscale_shard_busy_ratio",
                                "CPU used by the shard's process against what it may use, last interval",
                                value=load.busy)
        yield GaugeMetricFamily("kafscale_shard_bytes_in_per_second", "Record batch bytes produced per second",
                                value=load.bytes_in)
        yield GaugeMetricFamily("kafscale_shard_bytes_out_per_second", "Record batch bytes fetched per second",
                                value=load.bytes_out)
        yield GaugeMetricFamily("kafscale_shard_requests_per_second", "Kafka requests answered per second",
                                value=load.requests)
        rate_in = GaugeMetricFamily("kafscale_partition_bytes_in_per_second", "Record batch bytes produced per"
                                    " second, per (physical) partition led here", labels=["topic", "partition"])
        rate_out = GaugeMetricFamily("kafscale_partition_bytes_out_per_second", "Record batch bytes fetched per"
                                     " second, per (physical) partition led here", labels=["topic", "partition"])
        for p in load.partitions:
            rate_in.add_metric([p.topic, str(p.partition)], p.bytes_in)
            rate_out.add_metric([p.topic, str(p.partition)], p.bytes_out)
        yield rate_in
        yield rate_out
