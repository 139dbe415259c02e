"""The `autoscale` scenario: `--autoscale` on a Ray test cluster of 3 nodes with 1 CPU each, on this machine
(issue 21). Metadata in a real etcd, segments in the run's SeaweedFS; every node, driver and listener on 127.0.0.1.

The cluster starts at --min-shards 1. The load: kafscale.testing.load_producer at LOAD_MB_S (10 KB records,
acks=1) on a topic of 12 partitions (flat out it overloads the one shard, and every other producer waits behind
it for tens of seconds); on the same partitions (the ones the scale-up moves are the loaded ones), the
`cluster` scenario's traffic worker (an idempotent acks=all producer of 1 KiB records, flat out) records every
partition's pauses and checks that what it had acknowledged is stored. Throughput: the load's committed bytes
(the high watermarks' growth less the traffic worker's records, at 10 KB each) and the traffic worker's
acknowledged ones. Reported, each beside its target or a figure of the same run:
- time from the load's start until a second shard leads partitions (target: the scale-up delay plus a few
  seconds to start a shard; the delay is a setting, given as the limit);
- the produce pause of every partition the scale-up moved: its longest wait for an acknowledgement between the
  first scale-up and the moment placement stopped changing (p50, p99; target p99 <= 1 s, as for planned moves),
  with a quiet window before the load as the floor;
- throughput before the scale-up and after the cluster settled, same producer, same topic;
- time from the load's end until the cluster is back at one shard (the scale-down delay is the limit);
- the moves: every change of a partition's leader, sampled every 0.5 s, counted per scale event (a change of the
  number of shards leading partitions), with how many went back to a shard the partition had left in the same
  event (restless balancing; target 0) and how many moves a scale-up made against the fewest that reach its
  shard count (a partition each to every new shard's fair share).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
import threading
import time
from typing import Any

from benchmarks.cluster import REROUTE_S, Control, Traffic, _free_ports, _stop_serve, _summary, pause
from benchmarks.common import REPO, Context, MiB, Reference, Result, log, run_worker
from kafscale.testing.serve_process import ServeProcess

NODES, PARTITIONS = 3, 12
# On this 2-core machine the clients take most of the CPU: one shard under both producers flat out ran at a busy
# fraction of 0.21-0.28 (measured), so a target of 0.5 never scales. 0.12, as in tests/cluster/test_autoscale.py.
TARGET_UTILIZATION, UP_DELAY_S, DOWN_DELAY_S = 0.12, 5.0, 15.0
SETTLE_S = 8.0  # placement unchanged this long: the scale-up's moves are over
PAUSE_TARGET_S = 1.0
LOAD_RECORD_BYTES = 10_000  # kafscale.testing.load_producer's
LOAD_MB_S = 15


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
        topic = load_topic = "autoscale"
        run_worker("create_topics", {"bootstrap": serve.bootstrap_all, "topics": [[topic, PARTITIONS]]})
        before = _placement(ctl, topic)
        traffic = Traffic(ctx, serve.bootstrap_all, topic, PARTITIONS)
        stack.callback(traffic.kill)
        watermarks = _Watermarks(serve.bootstrap_all, load_topic)
        stack.callback(watermarks.stop)
        placements = _Placements(ctl, topic)
        stack.callback(placements.stop)
        load = subprocess.Popen([sys.executable, "-m", "kafscale.testing.load_producer", serve.bootstrap_all,
                                 load_topic, str(PARTITIONS), "900", str(LOAD_MB_S)], cwd=REPO,
                                stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE)
        stack.callback(lambda: load.poll() is None and load.kill())
        loaded = time.monotonic()
        up_at = _wait(lambda: len(set(_placement(ctl, topic).values())) >= 2, 180)
        settled_at = _settle(ctl, (topic,))
        after = _placement(ctl, topic)
        time.sleep(10.0)  # throughput after: a window of the settled cluster
        measured_after = (settled_at, time.monotonic())
        load.communicate(b"", timeout=120)  # stdin closed: it flushes and ends
        final = traffic.stop()
        stopped = time.monotonic()
        down_at = _wait(lambda: len([s for s in ctl.shards() if s["live"]]) == 1, DOWN_DELAY_S * 4 + 120)
        watermarks.stop()
        placements.stop()
    _report(ctx, args, final, watermarks.series, traffic.acked, loaded, up_at, settled_at, measured_after, stopped,
            down_at, before, after)
    _report_moves(ctx, args, placements.series)


class _Watermarks:
    """The load topic's records committed so far (the sum of its high watermarks), sampled every 0.5 s."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Consumer

        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-hwm-{os.getpid()}"})
        self.topic = topic
        self.series: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from confluent_kafka import TopicPartition

        while not self._stop.wait(0.5):
            try:
                total = sum(self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=5)[1]
                            for p in range(PARTITIONS))
            except Exception:  # a partition moving: the next sample
                continue
            self.series.append((time.monotonic(), total))

    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join(30)
            self.consumer.close()


class _Placements:
    """The topic's placement, sampled every 0.5 s: (time, partition -> shard) each time it changed."""

    def __init__(self, ctl: Control, topic: str) -> None:
        self.series: list[tuple[float, dict[int, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ctl, topic), daemon=True)
        self._thread.start()

    def _run(self, ctl: Control, topic: str) -> None:
        while not self._stop.wait(0.5):
            try:
                now = _placement(ctl, topic)
            except Exception:  # the controller busy or restarting: the next sample
                continue
            if len(now) == PARTITIONS and (not self.series or self.series[-1][1] != now):
                self.series.append((time.monotonic(), now))

    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join(30)


def scale_events(series: list[tuple[float, dict[int, int]]]) -> list[dict[str, Any]]:
    """The moves between placements, grouped by scale event: a change of the number of shards leading partitions
    starts one; the moves after it, until the next, are its balancing."""
    events: list[dict[str, Any]] = []
    for (_, old), (_, new) in itertools.pairwise(series):
        shards_old, shards_new = len(set(old.values())), len(set(new.values()))
        if shards_new != shards_old or not events:
            events.append({"shards": [shards_old, shards_new], "moves": 0, "moved_back": 0, "left": {}})
        event = events[-1]
        event["shards"][1] = shards_new
        for p in new:
            if new[p] != old[p]:
                event["moves"] += 1
                if new[p] in event["left"].get(p, ()):
                    event["moved_back"] += 1
                event["left"].setdefault(p, set()).add(old[p])
    for event in events:
        start, end = event["shards"]
        # The fewest moves that reach the new count: up, each new shard gets its fair share of partitions; down, the
        # leaving shards' partitions (their fair share) move.
        event["fewest"] = PARTITIONS * abs(end - start) // max(start, end) if start != end else 0
        event["partitions_moved"] = len(event.pop("left"))
    return events


def _report_moves(ctx: Context, args: list[str], series: list[tuple[float, dict[int, int]]]) -> None:
    events = scale_events(series)
    log(f"  scale events: {events}")
    settings = {"serve_args": [a for a in args if "secret" not in a], "partitions": PARTITIONS,
                "sampled_every_s": 0.5}
    for i, event in enumerate(events):
        direction = "up" if event["shards"][1] > event["shards"][0] else "down"
        name = f"scale_{direction}_{event['shards'][0]}_to_{event['shards'][1]}"
        ctx.add(Result("autoscale", f"{name}_moves", event["moves"], "moves", "seaweedfs",
                       [Reference("target", event["fewest"], "moves", "lower",
                                  "the fewest moves that reach the new shard count (a fair share each)")],
                       settings, {"event": i, **event}))
        ctx.add(Result("autoscale", f"{name}_moved_back", event["moved_back"], "moves", "seaweedfs",
                       [Reference("target", 0, "moves", "lower",
                                  "moves that take a partition back to a shard it left in the same event")],
                       settings, {"event": i, **event}))


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


def _settle(ctl: Control, topics: tuple[str, ...], timeout: float = 90) -> float:
    """Until the topics' placement has not changed for SETTLE_S (or `timeout`): when it last changed."""
    deadline = time.monotonic() + timeout

    def placement() -> list[dict[int, int]]:
        return [_placement(ctl, t) for t in topics]

    current, since = placement(), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < SETTLE_S:
        time.sleep(0.25)
        now = placement()
        if now != current:
            current, since = now, time.monotonic()
    return since


def _rate(series: list[tuple[float, int]], start: float, end: float) -> float | None:
    """Records per second committed within [start, end]."""
    inside = [(t, n) for t, n in series if start <= t <= end]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def _report(ctx: Context, args: list[str], final: dict[str, Any], committed: list[tuple[float, int]],
            acked: list[tuple[float, int]], loaded: float, up_at: float | None, settled_at: float,
            after_window: tuple[float, float], stopped: float, down_at: float | None, before: dict[int, int],
            after: dict[int, int]) -> None:
    gaps, last = final["gaps"], final["last"]
    moved = sorted(p for p in range(PARTITIONS) if before.get(p) != after.get(p))
    pauses = [pause(gaps[p], last[p], up_at, settled_at + REROUTE_S) for p in moved] if up_at else []
    floor = max((pause(gaps[p], last[p], loaded, loaded + 2.0) for p in range(PARTITIONS)), default=0.0)
    checked_before = _rate(acked, loaded + 2.0, up_at) if up_at else None
    checked_after = _rate(acked, *after_window)
    all_before = _rate(committed, loaded + 2.0, up_at) if up_at else None
    all_after = _rate(committed, *after_window)
    rate_before = None if all_before is None or checked_before is None else all_before - checked_before
    rate_after = None if all_after is None or checked_after is None else all_after - checked_after
    # The load shares the partitions: every record the traffic worker had acknowledged must be below the high
    # watermark (its own figures cannot equal them here); a lost one would also fail tests/cluster's exact check.
    check = {"acked": sum(final["acked"]), "high_watermarks": sum(final["high_watermarks"]),
             "acked_within_high_watermarks": all(a <= h for a, h in zip(final["acked"], final["high_watermarks"],
                                                                         strict=True)),
             "errors": final["errors"], "first_errors": final["first_errors"]}
    settings = {"serve_args": [a for a in args if "secret" not in a], "ray_nodes": NODES, "cpus_per_ray_node": 1,
                "partitions": PARTITIONS, "load": "kafscale.testing.load_producer, 10 KB, acks=1, flat out",
                "checked": "traffic worker (benchmarks/cluster.py), 1 KiB, idempotent acks=all",
                "machine_cpus": len(os.sched_getaffinity(0))}
    extra = {"exactly_once_check": check, "placement_before": before, "placement_after": after, "moved": moved,
             "settled_s_after_scale_up": None if up_at is None else round(settled_at - up_at, 2)}

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
    for name, before_rate, after_rate, size in (("load", rate_before, rate_after, LOAD_RECORD_BYTES),
                                                ("checked", checked_before, checked_after, 1024)):
        mib = size / MiB
        add(f"{name}_throughput_before_mib_s", None if before_rate is None else before_rate * mib, "MiB/s", [], {})
        add(f"{name}_throughput_after_mib_s", None if after_rate is None else after_rate * mib, "MiB/s",
            [] if before_rate is None else [Reference("limit", before_rate * mib, "MiB/s", "higher",
                                                      "1 shard before the scale-up, same run, producer and topic")],
            {"shards_after": len(set(after.values())), "load_mb_s_cap": LOAD_MB_S})
    add("time_back_to_min_s", None if down_at is None else down_at - stopped, "s",
        [Reference("limit", DOWN_DELAY_S, "s", "lower", "--scale-down-delay-s (a setting): the least it can be")], {})
    if not check["acked_within_high_watermarks"] or final["errors"]:
        log(f"  acknowledged and stored records differ, or errors: {check}")
