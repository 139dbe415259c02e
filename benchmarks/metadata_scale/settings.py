"""The sweep's defaults, the saturation rule, and the clock every process of a run reads."""

from __future__ import annotations

import time

FLUSH_MS = 50.0
PARTITIONS_PER_TXN = 8  # one shard's owners flushing in one window: 8 x 4 = 32 operations
MAX_PARTITIONS_PER_TXN = 30  # MAX_TXN_OPS (120) / 4 operations per partition
SHARDS_FULL = [1, 2, 4, 8, 16, 32, 64, 128, 256]
SHARDS_QUICK = [1, 4, 16, 64, 256]
BATCHER_SHARDS_FULL = [1, 4, 16, 64]  # the real CommitBatcher, each partition on its own flush timer
BATCHER_SHARDS_QUICK = [1, 16]
WATCHERS = [1, 8, 32, 100]
PLACEMENT_SMALL, PLACEMENT_LARGE = 250, 10_000  # partitions in the watched topic record
CLIENT_PROCS = 2
SATURATED_FRACTION = 0.9  # achieved below 90 % of offered, or
SATURATED_P99_MS = 250.0  # window-to-commit p99 above this: saturated
CLK = time.CLOCK_MONOTONIC  # system-wide, so times taken in different processes compare


def now() -> float:
    return time.clock_gettime(CLK)
