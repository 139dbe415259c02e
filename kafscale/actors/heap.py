"""Keep the garbage collector off the objects a broker process loads once and keeps.

A Ray worker starts with Ray, protobuf, boto3, kio and our own modules loaded: a few hundred thousand
objects that live as long as the process. CPython's cycle collector walks the whole of the oldest
generation on every full collection, and the hot path allocates short-lived containers (tasks,
futures, request objects) fast enough to trigger full collections many times a second. Freezing the
startup heap moves it out of every generation, so collections only walk what came after. Measured
with 16 partitions at 1 KiB acks=all: shard CPU per MiB fell by 15-25 % (docs/performance.md).
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect once, then move every object that survived into the permanent generation.
    Call at the end of a long-lived process's startup; returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
