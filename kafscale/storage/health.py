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
    """Records (time, latency, ok) of each call; only the owning process's event loop touches it."""

    def __init__(self, thresholds: HealthThresholds | None = None) -> None:
        self.thresholds = thresholds or HealthThresholds()
        self._samples: collections.deque[tuple[float, float, bool]] = collections.deque(
            maxlen=self.thresholds.max_samples
        )

    def record(self, latency_s: float, ok: bool) -> None:
        self._samples.append((time.monotonic(), latency_s * 1000.0, ok))

    def state(self) -> HealthState:
        t = self.thresholds
        horizon = time.monotonic() - t.window_s
        while self._samples and self._samples[0][0] < horizon:
            self._samples.popleft()
        n = len(self._samples)
        if n < t.min_samples:
            # Too little evidence either way, unless everything recent failed.
            if n and not any(ok for _, _, ok in self._samples):
                return HealthState.DEGRADED
            return HealthState.HEALTHY
        errors = sum(1 for _, _, ok in self._samples if not ok)
        rate = errors / n
        latency = sum(ms for _, ms, _ in self._samples) / n
        if rate >= t.unavailable_error_rate or latency >= t.unavailable_latency_ms:
            return HealthState.UNAVAILABLE
        if rate >= t.degraded_error_rate or latency >= t.degraded_latency_ms:
            return HealthState.DEGRADED
        return HealthState.HEALTHY
