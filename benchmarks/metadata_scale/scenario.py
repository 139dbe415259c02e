"""`python -m benchmarks --scenario metadata_scale`: one run (run.py) as Results of the harness, each beside
its target or the limit measured in the same run; the whole run also goes to metadata_scale.json."""

from __future__ import annotations

import json

from benchmarks.common import Context, Reference, Result
from benchmarks.metadata_scale.run import measure
from benchmarks.metadata_scale.settings import PLACEMENT_SMALL, SATURATED_FRACTION, SATURATED_P99_MS


def metadata_scale(ctx: Context) -> None:
    data = measure(ctx.work / "metadata-scale", ctx.quick)
    (ctx.out / "metadata_scale.json").write_text(json.dumps(data, indent=1))
    seq = data["sequential"]
    k = data["partitions_per_txn"]
    ctx.limits["etcd_sequential_cas_txn_s"] = seq["cas"]["txn_s"]
    ctx.limits[f"etcd_sequential_flush_k{k}_txn_s"] = seq[f"flush_k{k}"]["txn_s"]
    settings = {"backend": "etcd", "etcd": data["etcd"], "flush_ms": data["flush_ms"], "partitions_per_txn": k,
                "ops_per_txn": 4 * k, "client_procs": data["client_procs"]}
    seq_ref = Reference("limit", seq["cas"]["txn_s"], "txn/s", "higher",
                        "one client's sequential CAS on one key, same etcd, same run")
    ctx.add(Result("metadata_scale", "etcd_sequential_cas_txn_s", seq["cas"]["txn_s"], "txn/s", "etcd",
                   [Reference("limit", 1800.0, "txn/s", "higher", "BRIEF.md: 1,700-1,900 sequential CAS/s here")],
                   settings, {"sequential": seq}))
    for name, figure in seq.items():
        if name.startswith("flush_k"):
            ctx.add(Result("metadata_scale", f"etcd_sequential_{name}_txn_s", figure["txn_s"], "txn/s", "etcd",
                           [seq_ref], {**settings, "ops_per_txn": figure["ops"]}, {"figure": figure}))
    for step in data["commit_steps"]:
        n = step["shards"]
        s = {**settings, "shards": n, "warmup_s": step["warmup_s"], "duration_s": step["duration_s"]}
        offered = step["offered_txn_s"]
        ctx.add(Result("metadata_scale", f"commit_txn_s_{n}_shards", step["achieved_txn_s"], "txn/s", "etcd",
                       [Reference("target", SATURATED_FRACTION * offered, "txn/s", "higher",
                                  "90 % of the offered rate (N shards x 1 per flush interval)"),
                        Reference("limit", offered, "txn/s", "higher", "offered: N shards x 1 per flush interval"),
                        seq_ref], s, {"step": step}))
        lat = step["window_to_commit_ms"]
        for q in ("p50", "p99"):
            ctx.add(Result("metadata_scale", f"commit_latency_{q}_ms_{n}_shards", lat[q], "ms", "etcd",
                           [Reference("target", SATURATED_P99_MS, "ms", "lower",
                                      "saturation rule: window->commit p99 above 250 ms"),
                            Reference("limit", step["txn_round_trip_ms"][q] or 0.0, "ms", "lower",
                                      "the transaction's own round trip (without waiting for the one in flight)")]
                           if q == "p99" else [], s))
    for step in data["batcher_steps"]:
        n = step["shards"]
        s = {**settings, "mode": "batcher: each partition on its own flush timer, through CommitBatcher",
             "shards": n, "partitions_per_shard": k, "ops_per_txn": None, "warmup_s": step["warmup_s"],
             "duration_s": step["duration_s"]}
        ctx.add(Result("metadata_scale", f"batcher_txn_s_{n}_shards", step["achieved_txn_s"], "txn/s", "etcd",
                       [Reference("limit", step["partition_windows_s"], "txn/s", "lower",
                                  "one transaction per partition commit (nothing merged)"),
                        Reference("limit", step["offered_txn_s"], "txn/s", "lower",
                                  "one transaction per shard per flush window (everything merged)")], s,
                       {"step": step}))
        ctx.add(Result("metadata_scale", f"batcher_latency_p99_ms_{n}_shards", step["window_to_commit_ms"]["p99"],
                       "ms", "etcd", [Reference("target", SATURATED_P99_MS, "ms", "lower",
                                                "saturation rule: window->commit p99 above 250 ms")], s))
    sat = data["saturation"]
    ctx.add(Result("metadata_scale", "first_saturated_shards", sat["first_saturated_shards"], "shards", "etcd",
                   [], {**settings, "rule": sat["rule"], "shards_tried": [s["shards"] for s in data["commit_steps"]]},
                   {"saturation": sat}))
    for case in data["watch_fanout"]:
        w, placement = case["watchers"], case["placement_partitions"]
        name = f"watch_last_watcher_{{q}}_ms_{w}_watchers" + ("" if placement == PLACEMENT_SMALL else
                                                              f"_placement_{placement}")
        for q in ("p50", "p99"):
            ctx.add(Result("metadata_scale", name.format(q=q), case["last_watcher_ms"][q], "ms", "etcd",
                           [Reference("limit", data["flush_ms"], "ms", "lower",
                                      "one flush interval (the put spacing)")],
                           {**settings, "watchers": w, "placement_partitions": placement, "puts": case["puts"]},
                           {"case": case} if q == "p50" else {}))
