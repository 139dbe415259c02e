"""The `autoscale` scenario: `--autoscale` on a Ray test cluster of 3 nodes with 1 CPU each, on this machine
(issue 21). Metadata in a real etcd, segments in the run's SeaweedFS; every node, driver and listener on 127.0.0.1.

The cluster starts at --min-shards 1. The load is the `cluster` scenario's traffic worker: an idempotent acks=all
producer of 1 KiB records, flat out, on 12 partitions, in a process of its own. Reported, each beside its target
or a figure of the same run:
- time from the load's start until a second shard leads partitions (target: the scale-up delay plus a few
  seconds to start a shard; the delay is a setting, given as the limit);
- the produce pause of every partition the scale-up moved: its longest wait for an acknowledgement between the
  first scale-up and the moment placement stopped changing (p50, p99; target p99 <= 1 s, as for planned moves),
  with a quiet window before the load as the floor;
- throughput before the scale-up and after the cluster settled, same producer, same topic;
- time from the load's end until the cluster is back at one shard (the scale-down delay is the limit).
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

from benchmarks.cluster import REROUTE_S, Control, Traffic, _free_ports, _stop_serve, _summary, pause
from benchmarks.common import Context, MiB, Reference, Result, log, run_worker
from kafscale.testing.serve_process import ServeProcess

NODES, PARTITIONS = 3, 12
TARGET_UTILIZATION, UP_DELAY_S, DOWN_DELAY_S = 0.5, 5.0, 15.0
SETTLE_S = 8.0  # placement unchanged this long: the scale-up's moves are over
PAUSE_TARGET_S = 1.0


def autoscale(ctx: Context) -> None:
    from kafscale.testing.etcd_server import EtcdServer
    from kafscale.testing.ray_cluster import RayTestCluster
    from kafscale.testing.s3_servers import unique_bucket_name

    s3 = ctx.seaweed()
    bucket = unique_bucket_name("kfs-bench-autoscale")
    s3.store(bucket).close()
    with contextlib.ExitStack() as stack:
        etcd = stack.enter_context(EtcdServer(ctx.work / "autoscale-etcd", name="kafscale-bench-autoscale"))
        ray_cluster = stack.enter_context(RayTestCluster(nodes=NODES, cpus_per_node=1))
        args = ["--etcd-endpoints", etcd.endpoint, "--etcd-prefix", f"/bench-autoscale-{os.getpid()}/",
                "--s3-endpoint", s3.endpoint_url, "--s3-bucket", bucket, "--s3-region", s3.region,
                "--s3-access-key", s3.access_key, "--s3-secret-key", s3.secret_key,
                "--ray-address", ray_cluster.address, "--flush-interval-ms", "50",
                "--autoscale", "--min-shards", "1", "--max-shards", str(NODES),
                "--target-utilization", str(TARGET_UTILIZATION), "--scale-up-delay-s", str(UP_DELAY_S),
                "--scale-down-delay-s", str(DOWN_DELAY_S)]
        serve = ServeProcess(ctx.work / "autoscale-data", shards=NODES, ports=_free_ports(2 * NODES),
                             extra_args=args, log_path=ctx.work / "autoscale-serve.log")
        serve.start(timeout=180)
        stack.callback(_stop_serve, serve)
        ctl = Control(ray_cluster.address)
        stack.callback(ctl.ray.shutdown)
        topic = "autoscale-traffic"
        run_worker("create_topics", {"bootstrap": serve.bootstrap_all, "topics": [[topic, PARTITIONS]]})
        before = _placement(ctl, topic)
        traffic = Traffic(ctx, serve.bootstrap_all, topic, PARTITIONS)
        stack.callback(traffic.kill)
        loaded = time.monotonic()
        up_at = _wait(lambda: len({s for s in _placement(ctl, topic).values()}) >= 2, 180)
        settled_at, after = _settle(ctl, topic)
        time.sleep(10.0)  # throughput after: a window of the settled cluster
        measured_after = (settled_at, time.monotonic())
        final = traffic.stop()
        stopped = time.monotonic()
        down_at = _wait(lambda: len([s for s in ctl.shards() if s["live"]]) == 1, DOWN_DELAY_S * 4 + 120)
    _report(ctx, args, final, traffic.acked, loaded, up_at, settled_at, measured_after, stopped, down_at,
            before, after)


def _placement(ctl: Control, topic: str) -> dict[int, int]:
    return {int(p.rsplit("-", 1)[1]): s["id"] for s in ctl.shards() for p in s["partitions"]
            if p.rsplit("-", 1)[0] == topic}


def _wait(done: Any, timeout: float) -> float | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done():
            return time.monotonic()
        time.sleep(0.25)
    return None


def _settle(ctl: Control, topic: str, timeout: float = 180) -> tuple[float, dict[int, int]]:
    """Until placement has not changed for SETTLE_S: when it last changed, and what it is."""
    deadline = time.monotonic() + timeout
    current, since = _placement(ctl, topic), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < SETTLE_S:
        time.sleep(0.25)
        now = _placement(ctl, topic)
        if now != current:
            current, since = now, time.monotonic()
    return since, current


def _rate(series: list[tuple[float, int]], start: float, end: float) -> float | None:
    """Records per second acknowledged within [start, end]."""
    inside = [(t, n) for t, n in series if start <= t <= end]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def _report(ctx: Context, args: list[str], final: dict[str, Any], acked: list[tuple[float, int]], loaded: float,
            up_at: float | None, settled_at: float, after_window: tuple[float, float], stopped: float,
            down_at: float | None, before: dict[int, int], after: dict[int, int]) -> None:
    gaps, last = final["gaps"], final["last"]
    moved = sorted(p for p in range(PARTITIONS) if before.get(p) != after.get(p))
    pauses = [pause(gaps[p], last[p], up_at, settled_at + REROUTE_S) for p in moved] if up_at else []
    floor = max((pause(gaps[p], last[p], loaded, loaded + 2.0) for p in range(PARTITIONS)), default=0.0)
    rate_before = _rate(acked, loaded + 1.0, up_at) if up_at else None
    rate_after = _rate(acked, *after_window)
    check = {"acked": sum(final["acked"]), "high_watermarks": sum(final["high_watermarks"]),
             "every_partition_equal": final["acked"] == final["high_watermarks"], "errors": final["errors"],
             "first_errors": final["first_errors"]}
    settings = {"serve_args": [a for a in args if "secret" not in a], "ray_nodes": NODES, "cpus_per_ray_node": 1,
                "partitions": PARTITIONS, "record_bytes": 1024, "client": "traffic worker (benchmarks/cluster.py)",
                "machine_cpus": len(os.sched_getaffinity(0))}
    extra = {"exactly_once_check": check, "placement_before": before, "placement_after": after, "moved": moved}

    def add(name: str, value: float | None, unit: str, refs: list[Reference], more: dict[str, Any]) -> None:
        ctx.add(Result("autoscale", name, None if value is None else round(value, 4), unit, "seaweedfs", refs,
                       settings, {**extra, **more}))

    add("time_to_extra_shard_s", None if up_at is None else up_at - loaded, "s",
        [Reference("limit", UP_DELAY_S, "s", "lower", "--scale-up-delay-s (a setting): the least it can be")], {})
    ps = _summary(pauses)
    pause_refs = [Reference("target", PAUSE_TARGET_S, "s", "lower", "per-partition produce pause in a move, p99"),
                  Reference("limit", floor, "s", "lower", "longest acknowledgement gap of any partition in the "
                                                          "load's first 2 s (no move), same run")]
    add("move_pause_p50_s", ps["p50"], "s", pause_refs, {"pauses": ps})
    add("move_pause_p99_s", ps["p99"], "s", pause_refs, {"pauses": ps})
    to_mib = 1024 / MiB
    add("throughput_before_mib_s", None if rate_before is None else rate_before * to_mib, "MiB/s", [], {})
    add("throughput_after_mib_s", None if rate_after is None else rate_after * to_mib, "MiB/s",
        [] if rate_before is None else [Reference("limit", rate_before * to_mib, "MiB/s", "higher",
                                                  "1 shard before the scale-up, same run, producer and topic")],
        {"shards_after": len(set(after.values()))})
    add("time_back_to_min_s", None if down_at is None else down_at - stopped, "s",
        [Reference("limit", DOWN_DELAY_S, "s", "lower", "--scale-down-delay-s (a setting): the least it can be")], {})
    if not check["every_partition_equal"] or final["errors"]:
        log(f"  acknowledged and stored records differ, or errors: {check}")
