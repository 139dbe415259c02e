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


def _judge_from_scratch(samples: list[tuple[float, float, bool]], t: HealthThresholds) -> HealthState:
    """The gate's rule written out plainly over the samples still in the window."""
    n = len(samples)
    if n < t.min_samples:
        return HealthState.DEGRADED if n and not any(ok for _, _, ok in samples) else HealthState.HEALTHY
    rate = sum(not ok for _, _, ok in samples) / n
    latency = sum(ms for _, ms, _ in samples) / n
    if rate >= t.unavailable_error_rate or latency >= t.unavailable_latency_ms:
        return HealthState.UNAVAILABLE
    if rate >= t.degraded_error_rate or latency >= t.degraded_latency_ms:
        return HealthState.DEGRADED
    return HealthState.HEALTHY


def test_running_totals_judge_as_the_whole_window_would(monkeypatch: Any) -> None:
    """Samples leave by age and by count; after thousands of calls the gate's verdict, error count and
    latency sum still match a recomputation over exactly the samples in the window."""
    import random

    now = [1000.0]
    monkeypatch.setattr("kafscale.storage.health.time.monotonic", lambda: now[0])
    t = HealthThresholds(degraded_latency_ms=100, unavailable_latency_ms=400, window_s=5.0, max_samples=64)
    health = HealthTracker(t)
    rng = random.Random(7)
    window: list[tuple[float, float, bool]] = []
    verdicts = set()
    for step in range(5000):
        now[0] += rng.choice([0.0, 0.01, 0.1, 1.0, 7.0]) if step % 50 else 0.0
        phase = (step // 500) % 3  # healthy, slow, failing stretches
        latency_s = rng.uniform(0.0, 0.09) if phase == 0 else rng.uniform(0.05, 0.6)
        ok = phase != 2 or rng.random() < 0.5
        health.record(latency_s, ok)
        window.append((now[0], latency_s * 1000.0, ok))
        window = [s for s in window[-t.max_samples :] if s[0] >= now[0] - t.window_s]
        verdict = health.state()
        verdicts.add(verdict)
        assert verdict == _judge_from_scratch(window, t), step
        assert health._errors == sum(not ok for _, _, ok in window)
        assert abs(health._latency_sum - sum(ms for _, ms, _ in window)) < 1e-6
    assert verdicts == set(HealthState)
