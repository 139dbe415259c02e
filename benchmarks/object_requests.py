"""The `object_requests` scenario (issue 36): object-store PUTs per GiB written, the figure that decides an S3 bill.

A `kafscale serve` at the default flush settings (flush_interval_ms 50, segment_bytes 4 MiB; 2 shards), one
librdkafka producer (1 KiB records, acks=all, linger.ms 5), each case on a topic of its own:
- 12 partitions, flat out;
- 12 partitions at 8 MiB/s (a steady, moderate load);
- 1,000 partitions, flat out, records spread round robin.
PUTs come from the shards' `kafscale_object_store_requests_total{kind="put"}` (a pack is one; a segment and its
index stored on their own are two, as S3 bills them), bytes from `kafscale_bytes_in_total`, both over the case.
Target: at most 300 PUTs per GiB. Beside it, the shards' CPU per Produce request answered (from /proc and
/metrics): at 8 MiB/s the requests are small (a few KiB), the case of the per-request target (150 µs).
"""

from __future__ import annotations

import re
from typing import Any

from benchmarks.common import Broker, Context, Reference, Result, broker, log, run_worker

TARGET_PUTS_PER_GIB = 300
TARGET_CPU_US_PER_REQUEST = 150
GiB = 1 << 30
CASES = (("12_partitions_flat_out", 12, 0.0), ("12_partitions_8_mib_s", 12, 8.0),
         ("1000_partitions_flat_out", 1000, 0.0))


def _produce_requests(b: Broker) -> float:
    """Produce requests the shards answered so far."""
    return b.metrics().get("kafscale_request_duration_seconds", {}).get("Produce", [0.0, 0.0])[1]


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
                cpu0, requests0 = b.shard_cpu(), _produce_requests(b)
                out = run_worker("produce", {"bootstrap": b.bootstrap, "topic": topic, "partitions": partitions,
                                             "size": 1024, "duration": duration, "acks": "all",
                                             "rate": mib_s * 1024 if mib_s else 0})
                cpu, requests = b.shard_cpu() - cpu0, _produce_requests(b) - requests0
                b.wait_idle()
                puts1, bytes1 = _counters(b)
                puts, written = puts1 - puts0, bytes1 - bytes0
                per_gib = puts / (written / GiB) if written > 0 else None
                cpu_us = round(cpu / requests * 1e6) if requests else None
                detail: dict[str, Any] = {"puts": puts, "bytes": written, "producer_mib_s": out["mib_per_s"],
                                          "kib_per_put": round(written / puts / 1024) if puts else None,
                                          "produce_requests": requests,
                                          "request_kib": round(written / requests / 1024, 1) if requests else None,
                                          "shard_cpu_s": round(cpu, 2), "shard_cpu_us_per_request": cpu_us}
                log(f"  {backend} {name}: {detail}, {per_gib} PUTs/GiB")
                settings = {"partitions": partitions, "rate_mib_s": mib_s or "flat out", "record_bytes": 1024,
                            "acks": "all", "duration_s": duration, **b.settings}
                ctx.add(Result("object_requests", f"puts_per_gib_{name}", None if per_gib is None else round(per_gib),
                               "PUTs/GiB", backend,
                               [Reference("target", TARGET_PUTS_PER_GIB, "PUTs/GiB", "lower",
                                          "issue 36: object-store PUTs per GiB written at the default settings")],
                               settings, detail))
                ctx.add(Result("object_requests", f"shard_cpu_us_per_request_{name}", cpu_us, "µs", backend,
                               [Reference("target", TARGET_CPU_US_PER_REQUEST, "µs", "lower",
                                          "issue 36: shard CPU per small acks=all Produce request")]
                               if mib_s else [], settings, detail))
