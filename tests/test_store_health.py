"""S3 health gating judges latency per MiB moved: big uploads under load are throughput, not sickness."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from kafscale.storage.async_store import AsyncObjectStore
from kafscale.storage.health import HealthState, HealthThresholds, HealthTracker
from kafscale.storage.local_store import LocalDirStore


class SlowStore(LocalDirStore):
    """Every call takes `delay` seconds: the latency of a busy or sick S3, which a local store cannot produce."""

    delay = 0.2

    def put_if_absent(self, key: str, data: bytes) -> bool:
        time.sleep(self.delay)
        return super().put_if_absent(key, data)

    def head(self, key: str) -> Any:
        time.sleep(self.delay)
        return super().head(key)


async def test_slow_large_uploads_keep_the_store_healthy_slow_small_calls_do_not(tmp_path: Path) -> None:
    health = HealthTracker(HealthThresholds(degraded_latency_ms=100, unavailable_latency_ms=1000))
    store = AsyncObjectStore(SlowStore(tmp_path), health=health)
    try:
        for i in range(4):  # 200 ms for 4 MiB: 50 ms per MiB
            assert await store.put_if_absent(f"ns/t/0/seg-{i}", bytes(4 << 20))
        assert store.state() == HealthState.HEALTHY
        for i in range(8):  # 200 ms for a HEAD: the store itself is slow
            await store.head(f"ns/t/0/seg-{i}")
        assert store.state() == HealthState.DEGRADED
    finally:
        store.close()


async def test_time_waiting_for_a_free_thread_is_not_store_latency(tmp_path: Path) -> None:
    """Ten small calls queued behind one thread: each takes 60 ms in the store, the last waits 540 ms for the
    thread. That queue is our own backlog (a burst of acks=1 uploads), so the gate must stay open."""
    slow = SlowStore(tmp_path)
    slow.delay = 0.06
    health = HealthTracker(HealthThresholds(degraded_latency_ms=200, unavailable_latency_ms=1000))
    store = AsyncObjectStore(slow, max_workers=1, health=health)
    try:
        started = time.monotonic()
        await asyncio.gather(*(store.head(f"ns/t/0/seg-{i}") for i in range(10)))
        assert time.monotonic() - started >= 0.55  # they did queue
        assert store.state() == HealthState.HEALTHY
    finally:
        store.close()
