"""The `object_requests` scenario (issue 36): object-store PUTs per GiB written, the figure that decides an S3 bill.

A `kafscale serve` at the default flush settings (flush_interval_ms 50, segment_bytes 4 MiB; 2 shards), one
librdkafka producer (1 KiB records, acks=all, linger.ms 5), each case on a topic of its own:
- 12 partitions, flat out;
- 12 partitions at 8 MiB/s (a steady, moderate load);
- 1,000 partitions, flat out, records spread round robin.
PUTs come from the shards' `kafscale_object_store_requests_total{kind="put"}` (a segment and its index are two, as
S3 bills them), bytes from `kafscale_bytes_in_total`, both over the case. Target: at most 300 PUTs per GiB.
"""

from __future__ import annotations

import re
from typing import Any

from benchmarks.common import Broker, Context, Reference, Result, broker, log, run_worker

TARGET_PUTS_PER_GIB = 300
GiB = 1 << 30
CASES = (("12_partitions_flat_out", 12, 0.0), ("12_partitions_8_mib_s", 12, 8.0),
         ("1000_partitions_flat_out", 1000, 0.0))


def _counters(b: Broker) -> tuple[float, float]:
    """(PUT requests, bytes in) summed over the shards' /metrics."""
    puts = written = 0.0
    for text in b.scrape():
        for line in text.splitlines():
            if m := re.match(r'^kafscale_object_store_requests_total\{kind="put"\} ([0-9.eE+-]+)$', line):
                puts += float(m.group(1))
            elif m := re.match(r"^kafscale_bytes_in_total\{[^}]*\} ([0-9.eE+-]+)$", line):
                written += float(m.group(1))
    return puts, written


def object_requests(ctx: Context) -> None:
    duration = 5.0 if ctx.quick else 15.0
    for backend in ctx.backends:
        with broker(ctx, backend, "object-requests") as b:
            for name, partitions, mib_s in CASES:
                topic = f"puts-{partitions}-{int(mib_s)}"
                made = run_worker("create_topics", {"bootstrap": b.bootstrap, "topics": [(topic, partitions)]})
                if made["errors"]:
                    raise RuntimeError(f"create {topic}: {made['errors']}")
                b.wait_idle()
                puts0, bytes0 = _counters(b)
                out = run_worker("produce", {"bootstrap": b.bootstrap, "topic": topic, "partitions": partitions,
                                             "size": 1024, "duration": duration, "acks": "all",
                                             "rate": mib_s * 1024 if mib_s else 0})
                b.wait_idle()
                puts1, bytes1 = _counters(b)
                per_gib = (puts1 - puts0) / ((bytes1 - bytes0) / GiB) if bytes1 > bytes0 else None
                detail: dict[str, Any] = {"puts": puts1 - puts0, "bytes": bytes1 - bytes0,
                                          "producer_mib_s": out["mib_per_s"],
                                          # a flush stores a segment and its index: 2 PUTs
                                          "mean_segment_kib": None if not per_gib else round(2 * GiB / per_gib / 1024)}
                log(f"  {backend} {name}: {detail}, {per_gib} PUTs/GiB")
                settings = {"partitions": partitions, "rate_mib_s": mib_s or "flat out", "record_bytes": 1024,
                            "acks": "all", "duration_s": duration, **b.settings}
                ctx.add(Result("object_requests", f"puts_per_gib_{name}", None if per_gib is None else round(per_gib),
                               "PUTs/GiB", backend,
                               [Reference("target", TARGET_PUTS_PER_GIB, "PUTs/GiB", "lower",
                                          "issue 36: object-store PUTs per GiB written at the default settings")],
                               settings, detail))
