"""The shard's Prometheus figures mirrored into Ray's metrics (ray.util.metrics), for the Ray dashboard.

Every few seconds the shard's registry is read and the changes pushed: counters as counter increments,
gauges as gauge values, histograms as their `_sum` and `_count` counters (rate(sum)/rate(count) is the
mean latency). Names are the same as on /metrics; Ray's exporter prefixes them with `ray_`, and every
series carries `shard` and `node` tags. Periodic, not per request: Ray metric calls cost more than a counter.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from prometheus_client import CollectorRegistry

log = logging.getLogger(__name__)
INTERVAL_S = 5.0


class RayMirror:
    def __init__(self, registry: CollectorRegistry, shard_id: int, node: str = "") -> None:
        self.registry = registry
        self.shard = str(shard_id)
        self.node = node
        self._metrics: dict[str, Any] = {}
        self._last: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def _metric(self, kind: str, name: str, doc: str, labels: tuple[str, ...]) -> Any:
        from ray.util import metrics

        metric = self._metrics.get(name)
        if metric is None:
            cls = metrics.Counter if kind == "counter" else metrics.Gauge
            metric = self._metrics[name] = cls(name, description=doc or name, tag_keys=(*labels, "shard", "node"))
        return metric

    def push(self) -> int:
        """One round; returns the number of series pushed."""
        pushed = 0
        for family in self.registry.collect():
            for sample in family.samples:
                if family.type == "histogram" and not sample.name.endswith(("_sum", "_count")):
                    continue
                if family.type in ("counter", "histogram") and sample.name.endswith("_created"):
                    continue
                kind = "gauge" if family.type == "gauge" else "counter"
                labels = tuple(sorted(sample.labels.items()))
                metric = self._metric(kind, sample.name, family.documentation, tuple(k for k, _ in labels))
                tags = {**dict(labels), "shard": self.shard, "node": self.node}
                if kind == "gauge":
                    metric.set(sample.value, tags=tags)
                else:
                    key = (sample.name, labels)
                    delta = sample.value - self._last.get(key, 0.0)
                    self._last[key] = sample.value
                    if delta > 0:
                        metric.inc(delta, tags=tags)
                pushed += 1
        return pushed

    async def run(self, interval_s: float = INTERVAL_S) -> None:
        while True:
            try:
                self.push()
            except Exception as e:  # never let metrics take a shard down
                log.warning("pushing metrics to Ray failed: %s", e)
            await asyncio.sleep(interval_s)
