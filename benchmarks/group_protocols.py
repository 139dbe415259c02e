"""The `group_protocols` scenario (KIP-848; not in the default run): members joining a group one at a time, under
the classic protocol and the consumer protocol, on Kafscale and on Apache Kafka 4.4.0.

50 confluent-kafka members (`--quick`: 8) join one group, one at a time, on a 200-partition topic into which a
producer writes 2,000 records/s; each joins once the group has settled after the one before and the newcomer has
consumed. Three ways of joining (benchmarks/group_joins_worker.py has what is measured):
- `classic-range`: the classic protocol with librdkafka's default assignors (range, roundrobin): an eager
  rebalance, every member gives up everything at every join;
- `classic-cooperative-sticky`: the classic protocol, cooperative-sticky: only moving partitions are revoked, in
  two rebalances;
- `consumer`: KIP-848 (`group.protocol=consumer`), the broker's default assignor (uniform).
Every member heartbeats every 500 ms (the classic clients by `heartbeat.interval.ms`, consumer-protocol members
by the broker's group.consumer.heartbeat.interval.ms), since a member learns of a rebalance by its heartbeat.

Kafscale: `kafscale serve`, 2 shards, the run's first backend. Apache Kafka: single-node KRaft, its start script's
JVM settings (as in `vs_kafka`). The figure: all_consuming_s (first subscribe to the last member's first record),
with Kafka's beside it; also per join the settle time, the records produced into partitions no member held (what
the group stopped for), and the time members that were consuming held nothing.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from benchmarks.common import Context, Reference, Result, broker, log, run_worker
from kafscale.testing.kafka_reference import LATEST, PRODUCTION_JVM_FLAGS, ReferenceKafka

PARTITIONS, RATE, HEARTBEAT_MS = 200, 2000.0, 500
MEMBERS, QUICK_MEMBERS = 50, 8
VARIANTS: dict[str, dict[str, Any]] = {
    "classic-range": {"group.protocol": "classic", "partition.assignment.strategy": "range,roundrobin",
                      "heartbeat.interval.ms": HEARTBEAT_MS, "session.timeout.ms": 10_000},
    "classic-cooperative-sticky": {"group.protocol": "classic", "partition.assignment.strategy": "cooperative-sticky",
                                   "heartbeat.interval.ms": HEARTBEAT_MS, "session.timeout.ms": 10_000},
    "consumer": {"group.protocol": "consumer"},
}
DURATION = re.compile(r'^kafscale_request_duration_seconds_(sum|count|bucket)\{api="(\w+)"(?:,le="([^"]+)")?\} (\S+)$')
GROUP_APIS = ("ConsumerGroupHeartbeat", "JoinGroup", "SyncGroup", "Heartbeat", "OffsetCommit")
FIGURES = (("all_consuming_s", "s"), ("join_settle_p50_s", "s"), ("join_settle_max_s", "s"),
           ("records_waited", "records"), ("paused_member_s", "member-s"))


def _joins(bootstrap: str, name: str, variant: str, members: int) -> dict[str, Any]:
    topic = f"gp-{name}-{variant}-{time.monotonic_ns() % 10**6}"
    made = run_worker("create_topics", {"bootstrap": bootstrap, "topics": [(topic, PARTITIONS)]})
    if made["errors"]:
        raise RuntimeError(f"create {topic}: {made['errors']}")
    time.sleep(1.0)  # every partition's leader known to the clients' first Metadata
    params = {"bootstrap": bootstrap, "topic": topic, "partitions": PARTITIONS, "members": members, "rate": RATE,
              "group": f"{topic}-group", "config": VARIANTS[variant]}
    out = run_worker("group_joins", params, timeout=1800)
    if "error" in out:
        raise RuntimeError(out["error"])
    log(f"  {name} {variant}: all consuming after {out['all_consuming_s']} s; a join settles in"
        f" {out['join_settle_p50_s']} s (p50), {out['join_settle_max_s']} s (max); {out['records_waited']} records"
        f" waited; members held nothing for {out['paused_member_s']} member-s")
    return out


def _group_requests(pages: list[str]) -> dict[str, list[float]]:
    """From the shards' /metrics: per group API, [count, seconds summed, answered within the heartbeat interval]."""
    out: dict[str, list[float]] = {}
    for text in pages:
        for line in text.splitlines():
            m = DURATION.match(line)
            if not m or m.group(2) not in GROUP_APIS:
                continue
            kind, api, le, value = m.group(1), m.group(2), m.group(3), float(m.group(4))
            slot = out.setdefault(api, [0.0, 0.0, 0.0])
            if kind == "count":
                slot[0] += value
            elif kind == "sum":
                slot[1] += value
            elif le is not None and le != "+Inf" and abs(float(le) - HEARTBEAT_MS / 1000) < 1e-9:
                slot[2] += value
    return out


def _latency(before: dict[str, list[float]], after: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Per group API over a run: requests, their mean duration and the share slower than the heartbeat interval
    (librdkafka gives a ConsumerGroupHeartbeat that long before it times the request out)."""
    out = {}
    for api, (count, total, within) in after.items():
        c0, t0, w0 = before.get(api, [0.0, 0.0, 0.0])
        if count > c0:
            out[api] = {"requests": count - c0, "mean_ms": round((total - t0) / (count - c0) * 1000, 2),
                        "slower_than_heartbeat_interval": round(1 - (within - w0) / (count - c0), 4)}
    return out


def _runs(bootstrap: str, name: str, members: int,
          scrape: Callable[[], list[str]] | None = None) -> dict[str, dict[str, Any]]:
    """Every variant; one that fails is reported with its error, the others still run. scrape: the broker's
    /metrics pages, for how long it took to answer the group requests."""
    runs: dict[str, dict[str, Any]] = {}
    for variant in VARIANTS:
        before = _group_requests(scrape()) if scrape else {}
        try:
            runs[variant] = _joins(bootstrap, name, variant, members)
        except Exception as e:
            log(f"  {name} {variant} FAILED: {e}")
            runs[variant] = {"error": f"{type(e).__name__}: {e}"}
        if scrape:
            runs[variant]["broker_answers"] = _latency(before, _group_requests(scrape()))
            log(f"  {name} {variant}: group requests as the broker answered them {runs[variant]['broker_answers']}")
    return runs


def group_protocols(ctx: Context) -> None:
    members = QUICK_MEMBERS if ctx.quick else MEMBERS
    kafka = ReferenceKafka(LATEST, parent_dir=ctx.work, jvm_flags=PRODUCTION_JVM_FLAGS,
                           overrides={"group.consumer.heartbeat.interval.ms": str(HEARTBEAT_MS)})
    with kafka:
        theirs = _runs(kafka.bootstrap, "kafka", members)
    backend = ctx.backends[0]
    flags = ["--group-consumer-heartbeat-interval-ms", str(HEARTBEAT_MS),
             "--group-consumer-min-heartbeat-interval-ms", str(HEARTBEAT_MS)]
    with broker(ctx, backend, "group_protocols", extra_args=flags) as b:
        ours = _runs(b.bootstrap, f"kafscale-{backend}", members, b.scrape)
    failed = []
    for variant, run in ours.items():
        kafka_run = theirs.get(variant, {})
        settings = {"members": members, "partitions": PARTITIONS, "records_per_s": RATE,
                    "heartbeat_interval_ms": HEARTBEAT_MS, "client": "confluent-kafka", "config": VARIANTS[variant],
                    "broker_answers": run.get("broker_answers"),
                    "kafka": {k: v for k, v in kafka_run.items() if k != "joins"}}
        if "error" in run:
            failed.append(f"{variant}: {run['error']}")
            continue
        for key, unit in FIGURES:
            refs = []
            if isinstance(kafka_run.get(key), int | float):
                refs.append(Reference("limit", float(kafka_run[key]), unit, "lower",
                                      f"Apache Kafka {LATEST} on this machine, same clients and joins"))
            value = run.get(key)
            ctx.add(Result("group_protocols", f"{variant}_{key}", None if value is None else float(value), unit,
                           backend, references=refs, settings=settings,
                           extra={"joins": run["joins"], "kafka_joins": kafka_run.get("joins")}
                           if key == "all_consuming_s" else {}))
    failed += [f"kafka {variant}: {run['error']}" for variant, run in theirs.items() if "error" in run]
    if failed:
        raise RuntimeError("; ".join(failed))
