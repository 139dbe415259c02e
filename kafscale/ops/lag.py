"""Consumer lag sampler: every few seconds, each shard reads the committed group offsets from the metadata
store and reports, for the partitions it owns, high watermark minus committed offset.

Sampled rather than computed per scrape, so a Prometheus scrape never waits on the metadata store; one
range read per shard per interval (group_offsets/, see kafscale.cluster.keys). A partition's lag is
reported by the shard that owns it, once its owner is open there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from urllib.parse import unquote

from kafscale.broker.stats import ShardStats
from kafscale.storage.metadata_store import MetadataStore

log = logging.getLogger(__name__)
OFFSETS_PREFIX = "group_offsets/"
INTERVAL_S = 10.0


class LagSampler:
    def __init__(self, meta: MetadataStore, stats: Callable[[], ShardStats], interval_s: float = INTERVAL_S) -> None:
        self.meta = meta
        self.stats = stats
        self.interval_s = interval_s
        self._lags: list[tuple[str, str, int, int]] = []

    def lags(self) -> list[tuple[str, str, int, int]]:
        """(group, topic, partition, lag) as of the last sample."""
        return self._lags

    async def sample(self) -> None:
        ends = {(p.topic, p.partition): p.high_watermark for p in self.stats().partitions}
        lags = []
        for kv in await self.meta.range(OFFSETS_PREFIX):
            parts = kv.key[len(OFFSETS_PREFIX):].rsplit("/", 2)
            if len(parts) != 3 or not parts[2].isdigit() or not isinstance(kv.value, dict):
                continue
            group, topic, partition = unquote(parts[0]), parts[1], int(parts[2])
            end = ends.get((topic, partition))
            committed = kv.value.get("offset")
            if end is None or not isinstance(committed, int) or committed < 0:
                continue
            lags.append((group, topic, partition, max(end - committed, 0)))
        self._lags = lags

    async def run(self) -> None:
        while True:
            try:
                await self.sample()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the store will be back; keep the last sample meanwhile
                log.debug("consumer lag sample failed: %s", e)
            await asyncio.sleep(self.interval_s)
