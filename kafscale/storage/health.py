"""S3 health gating: a sliding window over object store calls decides healthy / degraded / unavailable.

The seed's rule: average latency or error rate above a threshold degrades the store; produce and
fetch are then refused with a retriable error instead of piling requests onto a sick S3.
"""

from __future__ import annotations

import collections
import enum
import time
from dataclasses import dataclass


class HealthState(enum.IntEnum):
    HEALTHY = 0
    DEGRADED = 1
    UNAVAILABLE = 2


@dataclass(frozen=True, slots=True)
class HealthThresholds:
    degraded_latency_ms: float = 500.0
    unavailable_latency_ms: float = 3000.0
    degraded_error_rate: float = 0.2
    unavailable_error_rate: float = 0.6
    window_s: float = 30.0
    max_samples: int = 512
    min_samples: int = 3  # a single slow call must not flip the state


class HealthTracker:
    """Records (time, latency, ok) of each call; only the owning process's event loop touches it.

    state() is asked on every produce and fetch, so it keeps running totals instead of summing the
    window each time."""

    def __init__(self, thresholds: HealthThresholds | None = None) -> None:
        self.thresholds = thresholds or HealthThresholds()
        self._samples: collections.deque[tuple[float, float, bool]] = collections.deque()
        self._latency_sum = 0.0
        self._errors = 0

    def record(self, latency_s: float, ok: bool) -> None:
        if len(self._samples) >= self.thresholds.max_samples:
            self._drop_oldest()
        ms = latency_s * 1000.0
        self._samples.append((time.monotonic(), ms, ok))
        self._latency_sum += ms
        self._errors += not ok

    def _drop_oldest(self) -> None:
        _, ms, ok = self._samples.popleft()
        self._errors -= not ok
        # Reset at empty, so that float rounding cannot accumulate over a long life.
        self._latency_sum = self._latency_sum - ms if self._samples else 0.0

    def state(self) -> HealthState:
        t = self.thresholds
        horizon = time.monotonic() - t.window_s
        while self._samples and self._samples[0][0] < horizon:
            self._drop_oldest()
        n = len(self._samples)
        if n < t.min_samples:
            # Too little evidence either way, unless everything recent failed.
            if n and self._errors == n:
                return HealthState.DEGRADED
            return HealthState.HEALTHY
        rate = self._errors / n
        latency = self._latency_sum / n
        if rate >= t.unavailable_error_rate or latency >= t.unavailable_latency_ms:
            return HealthState.UNAVAILABLE
        if rate >= t.degraded_error_rate or latency >= t.degraded_latency_ms:
            return HealthState.DEGRADED
        return HealthState.HEALTHY
