"""One step of the commit sweep, from the harness: N simulated shards in the worker processes (commit_load.py)
against the etcd under test, measured between warm-up and end; the step's figures and whether it saturated."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from benchmarks.common import loadavg, process_cpu_seconds, summary
from benchmarks.metadata_scale.etcd_probes import ETCD_METRICS, clear, etcd_metrics, machine_cpu
from benchmarks.metadata_scale.settings import SATURATED_FRACTION, SATURATED_P99_MS, now
from benchmarks.metadata_scale.worker_process import Child


def sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - now()))


def commit_step(etcd: Any, work: Path, n: int, k: int, flush_ms: float, warmup: float, duration: float,
                 procs: int, mode: str = "window") -> dict[str, Any]:
    prefix = f"/bench-meta-{n}-{time.monotonic_ns()}/"
    groups = [list(range(i, n, procs)) for i in range(min(procs, n))]
    children = [Child("commit", {"endpoint": etcd.endpoint, "prefix": prefix, "shards": g, "total_shards": n,
                                  "k": k, "flush_ms": flush_ms, "warmup_s": warmup, "duration_s": duration,
                                  "mode": mode}, work)
                for g in groups]
    try:
        for c in children:
            if c.line(120) is None:
                raise TimeoutError("commit worker not ready within 120 s")
        t0 = now() + 0.2
        for c in children:
            c.go(t0)
        sleep_until(t0 + warmup)
        cpu0, m0, box0 = process_cpu_seconds(etcd.pid), etcd_metrics(etcd.metrics_port), machine_cpu()
        sleep_until(t0 + warmup + duration)
        cpu1, m1, box1 = process_cpu_seconds(etcd.pid), etcd_metrics(etcd.metrics_port), machine_cpu()
        results = [c.result(120 + duration) for c in children]
    finally:
        for c in children:
            c.kill()
    cleared = asyncio.run(clear(etcd.endpoint, prefix))
    window = [x for r in results for x in r["window_ms"]]
    rtt = [x for r in results for x in r["rtt_ms"]]
    lag = [x for r in results for x in r["tick_lag_ms"]]
    windows = sum(r["offered"] for r in results)  # flush windows due in the measured window (shard or partition)
    txns = sum(r["txns"] for r in results)
    # "window": one transaction per shard per window is the offer. "batcher": the partitions' windows are; how
    # many transactions the batcher makes of them is the figure.
    offered = windows / duration if mode == "window" else n * 1000.0 / flush_ms
    achieved = txns / duration
    partition_windows = windows * (k if mode == "window" else 1)
    fsyncs = m1.get(ETCD_METRICS[0], 0) - m0.get(ETCD_METRICS[0], 0)
    fsync_s = m1.get(ETCD_METRICS[1], 0) - m0.get(ETCD_METRICS[1], 0)
    commits = m1.get(ETCD_METRICS[2], 0) - m0.get(ETCD_METRICS[2], 0)
    folded = sum(r["windows_folded"] for r in results)
    step = {
        "mode": mode, "shards": n, "partitions_per_shard": k, "flush_ms": flush_ms,
        "ops_per_txn": 4 * k if mode == "window" else None,
        "offered_txn_s": round(offered, 1), "achieved_txn_s": round(achieved, 1),
        "achieved_fraction": round(achieved / offered, 4) if offered else None,
        "partition_windows_s": round(partition_windows / duration, 1),
        "partition_commits_per_txn": round(partition_windows / txns, 2) if txns else None,
        "window_to_commit_ms": summary(window), "txn_round_trip_ms": summary(rtt),
        "timer_lag_ms": summary(lag),
        "windows_folded": folded,
        "failed_txns": sum(r["failed"] for r in results), "errors": sum(r["errors"] for r in results),
        "first_error": next((r["first_error"] for r in results if r["first_error"]), ""),
        "client_procs": len(children),
        "client_cpu_cores": [round(r["cpu_s"] / duration, 3) for r in results],
        "client_cpu_ms_per_txn": round(sum(r["cpu_s"] for r in results) / max(1, sum(r["txns"] for r in results))
                                       * 1000, 3),
        "etcd_cpu_cores": round((cpu1 - cpu0) / duration, 3),
        "etcd_cpu_ms_per_txn": round((cpu1 - cpu0) / max(1.0, achieved * duration) * 1000, 3),
        "machine_cpu_busy": round((box1[0] - box0[0]) / max(1, box1[2] - box0[2]), 3),
        "machine_cpu_niced": round((box1[1] - box0[1]) / max(1, box1[2] - box0[2]), 3),
        "etcd_wal_fsyncs_s": round(fsyncs / duration, 1),
        "etcd_wal_fsync_mean_ms": round(fsync_s / fsyncs * 1000, 3) if fsyncs else None,
        "etcd_backend_commits_s": round(commits / duration, 1),
        "etcd_db_bytes_after": m1.get(ETCD_METRICS[4]),
        # History kept until compaction: what each transaction adds to the database (issue 23's quota).
        "etcd_db_in_use_growth_bytes_per_txn": round((m1.get(ETCD_METRICS[5], 0) - m0.get(ETCD_METRICS[5], 0))
                                                     / max(1.0, achieved * duration), 1),
        "warmup_s": warmup, "duration_s": duration, "cleared_after": cleared,
        "loadavg": loadavg(),  # the machine may be shared: read figures beside it
    }
    p99 = step["window_to_commit_ms"]["p99"]
    if mode == "window":
        behind = achieved < SATURATED_FRACTION * offered
    else:  # a window that had to wait for its partition's previous commit
        behind = folded > (1 - SATURATED_FRACTION) * windows
    step["saturated"] = bool(windows and (behind or p99 is None or p99 > SATURATED_P99_MS))
    busy = max(step["client_cpu_cores"])
    step["client_bound"] = busy > 0.85  # one client process near a whole core: the figure is the client's
    return step
