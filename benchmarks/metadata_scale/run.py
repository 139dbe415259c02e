"""One whole run against one etcd of its own: the sequential limits, the commit sweeps ("window", then
"batcher") and the watch fan-out, returned as the JSON-ready dict that the CLI prints and the scenario reads."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from benchmarks.common import loadavg, log
from benchmarks.metadata_scale.commit_sweep import commit_step
from benchmarks.metadata_scale.etcd_probes import clear, etcd_version
from benchmarks.metadata_scale.settings import (
    BATCHER_SHARDS_FULL,
    BATCHER_SHARDS_QUICK,
    CLIENT_PROCS,
    FLUSH_MS,
    MAX_PARTITIONS_PER_TXN,
    PARTITIONS_PER_TXN,
    PLACEMENT_LARGE,
    PLACEMENT_SMALL,
    SATURATED_FRACTION,
    SATURATED_P99_MS,
    SHARDS_FULL,
    SHARDS_QUICK,
    WATCHERS,
    now,
)
from benchmarks.metadata_scale.watch_fanout import watch_case
from benchmarks.metadata_scale.worker_process import Child


def measure(work: Path, quick: bool, shards: list[int] | None = None, watchers: list[int] | None = None,
            k: int = PARTITIONS_PER_TXN, flush_ms: float = FLUSH_MS, procs: int = CLIENT_PROCS,
            batcher_shards: list[int] | None = None) -> dict[str, Any]:
    """Start etcd, run the limits, the commit sweep and the watch fan-out; return everything as a dict."""
    from kafscale.testing.etcd_server import EtcdServer

    if not 1 <= k <= MAX_PARTITIONS_PER_TXN:
        raise ValueError(f"partitions per transaction must be 1..{MAX_PARTITIONS_PER_TXN} (etcd's 128 operations)")
    work.mkdir(parents=True, exist_ok=True)
    shards = shards or (SHARDS_QUICK if quick else SHARDS_FULL)
    watchers = watchers or WATCHERS
    warmup, duration = (1.0, 3.0) if quick else (2.0, 6.0)
    puts = 30 if quick else 80
    t_start, load_at_start = now(), loadavg()
    with EtcdServer(work / "etcd-data", name="kafscale-bench") as etcd:
        log(f"metadata_scale: etcd {etcd.binary} on {etcd.endpoint} (pid {etcd.pid})")
        sequential = _sequential_limits(etcd, work, k, 1.5 if quick else 3.0)
        steps = _commit_sweep(etcd, work, "window", shards, k, flush_ms, warmup, duration, procs)
        batcher_steps = _commit_sweep(etcd, work, "batcher",
                                      batcher_shards or (BATCHER_SHARDS_QUICK if quick else BATCHER_SHARDS_FULL),
                                      k, flush_ms, warmup, duration, procs)
        fanout = _watch_fanout(etcd, work, watchers, puts, procs)
    knee = next((s["shards"] for s in steps if s["saturated"]), None)
    return {
        "benchmark": "metadata_scale",
        "etcd": {"binary": etcd.binary, "version": etcd_version(etcd.binary),
                 "settings": "one member on 127.0.0.1, data on local disk, heartbeat 50 ms, election 500 ms"},
        "quick": quick, "flush_ms": flush_ms, "partitions_per_txn": k, "client_procs": procs,
        "cpus": len(os.sched_getaffinity(0)), "loadavg_at_start": load_at_start,
        "sequential": sequential,
        "commit_steps": steps,
        "batcher_steps": batcher_steps,
        "saturation": {"first_saturated_shards": knee,
                       "rule": f"achieved < {SATURATED_FRACTION:.0%} of offered or window->commit p99 > "
                               f"{SATURATED_P99_MS:g} ms",
                       "largest_unsaturated_shards": max((s["shards"] for s in steps if not s["saturated"]),
                                                         default=None)},
        "watch_fanout": fanout,
        "seconds": round(now() - t_start, 1),
    }


def _sequential_limits(etcd: Any, work: Path, k: int, seconds: float) -> dict[str, Any]:
    """One client's sequential compare-and-swap and flush-shaped transactions on this etcd (commit_load.py)."""
    seq_child = Child("sequential", {"endpoint": etcd.endpoint, "prefix": "/bench-seq/", "k": k,
                                     "seconds": seconds}, work)
    try:
        sequential = seq_child.result(120)
    finally:
        seq_child.kill()
    asyncio.run(clear(etcd.endpoint, "/bench-seq/"))
    log(f"  sequential: CAS {sequential['cas']['txn_s']:.0f} txn/s, flush k={k} "
        f"{sequential[f'flush_k{k}']['txn_s']:.0f} txn/s")
    return sequential


def _commit_sweep(etcd: Any, work: Path, mode: str, counts: list[int], k: int, flush_ms: float, warmup: float,
                  duration: float, procs: int) -> list[dict[str, Any]]:
    """One commit_step per shard count, up the list, until two steps in a row saturated."""
    out: list[dict[str, Any]] = []
    saturated_in_a_row = 0
    for n in counts:
        step = commit_step(etcd, work, n, k, flush_ms, warmup, duration, procs, mode)
        out.append(step)
        log(f"  {mode}, {n} shards: offered {step['offered_txn_s']} achieved {step['achieved_txn_s']} "
            f"txn/s ({step['partition_commits_per_txn']} partition commits each), window->commit p50 "
            f"{step['window_to_commit_ms']['p50']:.1f} p99 {step['window_to_commit_ms']['p99']:.1f} ms, "
            f"client CPU {step['client_cpu_cores']}, etcd CPU {step['etcd_cpu_cores']}"
            f"{' SATURATED' if step['saturated'] else ''}")
        saturated_in_a_row = saturated_in_a_row + 1 if step["saturated"] else 0
        if saturated_in_a_row >= 2:  # past the knee: larger N only repeats it, slower
            break
    return out


def _watch_fanout(etcd: Any, work: Path, watchers: list[int], puts: int, procs: int) -> list[dict[str, Any]]:
    """Each watcher count with the small placement record, then the largest count with the large one."""
    fanout = []
    cases = [(w, PLACEMENT_SMALL) for w in watchers] + [(max(watchers), PLACEMENT_LARGE)]
    for w, placement in cases:
        case = watch_case(etcd, work, w, placement, puts, procs)
        fanout.append(case)
        log(f"  {w} watchers, placement of {placement}: last watcher p50 {case['last_watcher_ms']['p50']:.2f} "
            f"p99 {case['last_watcher_ms']['p99']:.2f} ms (missing {case['missing_events']})")
    return fanout
