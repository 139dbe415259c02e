"""Keeps the metadata store's revision history bounded: every flush commit is a revision, and etcd keeps every
revision until told to compact. Left alone, a busy cluster fills etcd's space quota ("mvcc: database space
exceeded") and every write fails.

One Compactor runs per cluster (in the controller). Every interval it notes the store's revision; it compacts
to the revision that was current `history_s` ago, so watchers have at least that long to resume where they left
off. A watcher that falls further behind gets CompactedError and reads its state afresh (storage/mirror.py,
cluster/topics.py). Compaction frees space inside etcd's database; giving it back to the file system is etcd's
defragmentation, an operator's job (docs/operations.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from kafscale.storage.metadata_store import MetadataStore, StoreStatus

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CompactionState:
    """What the last round saw and did: the figures the metrics report."""

    status: StoreStatus
    compacted_revision: int  # the oldest revision kept since this compactor's last compaction (0: none yet)

    @property
    def history_revisions(self) -> int:
        """Revisions kept: how far behind the current one the compaction point is (0 before the first)."""
        return self.status.revision - self.compacted_revision if self.compacted_revision else 0


class Compactor:
    def __init__(self, meta: MetadataStore, interval_s: float, history_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if interval_s <= 0 or history_s < 0:
            raise ValueError("interval_s must be positive and history_s not negative")
        self.meta = meta
        self.interval_s = interval_s
        self.history_s = history_s
        self._clock = clock
        self._seen: deque[tuple[float, int]] = deque()  # (when, revision), oldest first
        self.compacted_revision = 0
        self.state: CompactionState | None = None
        self.on_round: Callable[[CompactionState], None] = lambda _state: None

    async def round(self) -> CompactionState:
        """Note the revision now; compact to the newest one seen at least history_s ago, if it moved on."""
        status = await self.meta.status()
        now = self._clock()
        self._seen.append((now, status.revision))
        target = 0
        while self._seen and now - self._seen[0][0] >= self.history_s:
            target = self._seen.popleft()[1]
        if target > self.compacted_revision:
            await self.meta.compact(target)
            log.info("metadata store compacted to revision %d (now %d, %d revisions kept, database %d bytes)",
                     target, status.revision, status.revision - target, status.db_bytes)
            self.compacted_revision = target
        self.state = CompactionState(status, self.compacted_revision)
        self.on_round(self.state)
        return self.state

    async def run(self) -> None:
        """Rounds every interval_s until cancelled; a failed round (the store away) is logged and retried."""
        while True:
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("metadata compaction round failed (retried in %.0f s): %s", self.interval_s, e)
            await asyncio.sleep(self.interval_s)
