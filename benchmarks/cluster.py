"""The `cluster` scenario: the broker on a Ray test cluster of 3 nodes on this machine (issue 20).

Every Ray node, driver and listener is on 127.0.0.1; metadata in a real etcd, segments in the run's SeaweedFS
whatever --backend says (more than one node needs both). One `kafscale serve --ray-address` runs one shard per
node, each at the next port slot. Reported, each figure beside its target or a limit from the same run:

- throughput: the cluster starts with one node and is measured with the `produce` worker (1 KiB, acks=all,
  flat out; as in the `produce` scenario, and idempotent). Two nodes join, the controller gives them shards,
  `rebalance` spreads the partitions, and the same producers on the same topic are measured again;
- planned moves: the controller's `move` (what `kafscale partition move` calls) moves every partition in turn
  while an idempotent acks=all producer runs flat out. A move's pause is the longest wait for an acknowledgement
  of that partition overlapping the call or the REROUTE_S after it (the client may only learn of the move from
  its next metadata refresh). Target: p99 <= 1 s. A quiet window before the moves gives the floor;
- healing: with the same producer running, a worker node (never the head's, never the controller's) is
  SIGKILLed. Healing time runs from the kill until every partition has acknowledged a produce again. Target:
  <= 10 s. After each kill a node is added and the partitions rebalanced, so the next victim has some.

The flat-out producer has a process of its own (`python -m benchmarks.cluster traffic JSON`): it records every
gap of more than GAP_S between acknowledgements of a partition, prints its latest acknowledgement per partition
every 0.2 s, and at the end compares acknowledged records with the high watermarks. CLOCK_MONOTONIC is
system-wide, so its times and the harness's compare.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from benchmarks.common import REPO, Context, MiB, Reference, Result, log, percentile, run_worker
from kafscale.testing.serve_process import ServeProcess

NODES = 3
GAP_S = 0.02  # shorter acknowledgement gaps are not recorded: the pause resolution
REROUTE_S = 1.5  # a move's window goes on this long after the call: the client's metadata refresh (1 s) + 0.5
HEAL_TARGET_S, PAUSE_TARGET_S = 10.0, 1.0
PRODUCERS = [("", False), ("_idempotent", True)]  # (result name infix, enable.idempotence)
# One request in flight per connection: with librdkafka's default 5, librdkafka 2.16's idempotent producer kept
# one batch per partition in flight against several brokers while its broker threads spun (1.3-1.5 cores of this
# 2-core machine, 12-20 MiB/s, a partition's acknowledgements ~1 s apart without any move).
CLIENT = {"acks": "all", "enable.idempotence": True, "max.in.flight.requests.per.connection": 1, "linger.ms": 5,
          "queue.buffering.max.kbytes": 16 * 1024, "message.timeout.ms": 120_000, "retry.backoff.ms": 50,
          "retry.backoff.max.ms": 250, "reconnect.backoff.max.ms": 250, "topic.metadata.refresh.interval.ms": 1000}
INF = float("inf")


def traffic_worker(p: dict[str, Any]) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    topic, parts = p["topic"], int(p["partitions"])
    producer = Producer({"bootstrap.servers": p["bootstrap"], **CLIENT, **p.get("conf", {})})
    payload = os.urandom(int(p["size"]))
    last, acked = [0.0] * parts, [0] * parts
    gaps: list[list[tuple[float, float]]] = [[] for _ in range(parts)]
    errors: list[str] = []

    def done(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
            return
        now, i = time.monotonic(), msg.partition()
        if last[i] and now - last[i] > GAP_S:
            gaps[i].append((last[i], now))
        last[i] = now
        acked[i] += 1

    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    producer.list_topics(topic, timeout=30)
    t0 = report = time.monotonic()
    n = 0
    print(json.dumps({"ready": True}), flush=True)
    while not stop.is_set():
        try:
            producer.produce(topic, payload, partition=n % parts, on_delivery=done)
            n += 1
        except BufferError:  # the queue is full of unacknowledged records
            producer.poll(0.01)
        except Exception as e:  # a fatal idempotence error, say: counted, not hidden
            errors.append(f"produce: {e}")
            time.sleep(0.01)
        producer.poll(0)
        if time.monotonic() >= report:
            report = time.monotonic() + 0.2
            print(json.dumps({"last": last, "acked": sum(acked), "at": time.monotonic()}), flush=True)
    elapsed = time.monotonic() - t0
    unacked = producer.flush(120)
    consumer = Consumer({"bootstrap.servers": p["bootstrap"], "group.id": f"check-{os.getpid()}"})
    hwm = [consumer.get_watermark_offsets(TopicPartition(topic, i), timeout=30)[1] for i in range(parts)]
    consumer.close()
    print(json.dumps({"final": True, "gaps": gaps, "last": last, "acked": acked, "high_watermarks": hwm,
                      "sent": n, "unacked": unacked, "errors": len(errors), "first_errors": errors[:5],
                      "mib_per_s": sum(acked) * len(payload) / MiB / elapsed}), flush=True)


class Traffic:
    """The harness's side of the traffic worker: its latest acknowledgements, then its final record."""

    def __init__(self, ctx: Context, bootstrap: str, topic: str, partitions: int,
                 conf: dict[str, Any] | None = None) -> None:
        params = {"bootstrap": bootstrap, "topic": topic, "partitions": partitions, "size": 1024, "conf": conf or {}}
        self.stderr = (ctx.work / f"traffic-{topic}.stderr").open("w")  # librdkafka's logs
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.cluster", "traffic", json.dumps(params)],
                                     cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     text=True)
        self.last: list[float] = []
        self.acked: list[tuple[float, int]] = []  # (monotonic time, records acknowledged so far), every 0.2 s
        self.final: dict[str, Any] = {}
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        if not self.wait_served(0.0, 60):
            self.kill()
            raise RuntimeError("the traffic worker did not get every partition acknowledged within 60 s")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            d = json.loads(line)
            if d.get("final"):
                self.final = d
            elif "last" in d:
                self.last = d["last"]
                self.acked.append((d["at"], d["acked"]))

    def wait_served(self, since: float, timeout: float) -> bool:
        """Until every partition has an acknowledgement after `since` (monotonic)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.last and min(self.last) > since:
                return True
            time.sleep(0.05)
        return False

    def stop(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()
        self.reader.join(240)
        self.kill()
        if not self.final:
            raise RuntimeError("the traffic worker ended without its record")
        return self.final

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.stderr.close()


def pause(gaps: list[list[float]], last: float, start: float, end: float) -> float:
    """The longest wait for an acknowledgement of one partition that overlaps [start, end], from `start` at
    the earliest to the acknowledgement that ended it (0: none longer than GAP_S)."""
    if last < start:
        return INF
    return max([b - max(a, start) for a, b in gaps if b >= start and a <= end], default=0.0)


def served_after(gaps: list[list[float]], last: float, since: float) -> float:
    """Seconds from `since` to the partition's next acknowledgement (0: within GAP_S)."""
    if last < since:
        return INF
    return next((b - since for a, b in gaps if a <= since < b), 0.0)


class Control:
    """This process as a Ray driver on the test cluster, holding the controller's handle."""

    def __init__(self, address: str) -> None:
        import ray

        from kafscale.actors.controller import CONTROLLER_NAME
        from kafscale.actors.serve import RAY_NAMESPACE

        ray.init(address=address, namespace=RAY_NAMESPACE, log_to_driver=False, configure_logging=False,
                 _node_ip_address="127.0.0.1")
        self.ray = ray
        self.handle = ray.get_actor(CONTROLLER_NAME, namespace=RAY_NAMESPACE)

    def __call__(self, method: str, *args: Any) -> Any:
        return self.ray.get(getattr(self.handle, method).remote(*args), timeout=120)

    def shards(self) -> list[dict[str, Any]]:
        return [s for n in self("info")["nodes"] for s in n["shards"]]

    def wait_shards(self, count: int, timeout: float = 120) -> float:
        """Until `count` shards are live and none is not; returns the seconds waited."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            shards = self.shards()
            if len(shards) == count and all(s["live"] for s in shards):
                return time.monotonic() - t0
            time.sleep(0.25)
        raise TimeoutError(f"not {count} live shards after {timeout} s: {self.shards()}")


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    with contextlib.ExitStack() as stack:
        for s in socks:
            stack.enter_context(s).bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def _produce(bootstrap: str, topic: str, idempotent: bool, duration: float) -> dict[str, Any]:
    r = run_worker("produce", {"bootstrap": bootstrap, "topic": topic, "partitions": 6, "size": 1024, "acks": "all",
                               "duration": duration, "warmup": 1.0, "conf": {"enable.idempotence": idempotent}},
                   timeout=300)
    return {k: v for k, v in r.items() if k != "latency"}


def _summary(values: list[float]) -> dict[str, Any]:
    return {"count": len(values), "p50": percentile(values, 50), "p99": percentile(values, 99),
            "max": max(values, default=None), "unfinished": values.count(INF),
            "sorted": [round(v, 3) for v in sorted(values) if v != INF]}


def _finite(v: float | None, digits: int = 4) -> float | None:
    return None if v is None or v == INF else round(v, digits)


def cluster(ctx: Context) -> None:
    from kafscale.testing.etcd_server import EtcdServer
    from kafscale.testing.ray_cluster import RayTestCluster
    from kafscale.testing.s3_servers import unique_bucket_name

    if "seaweedfs" not in ctx.backends:
        log("  the cluster scenario runs on SeaweedFS and etcd whatever --backend says (multi-node needs both)")
    parts, rounds, kills = (6, 1, 3) if ctx.quick else (9, 3, 5)
    s3 = ctx.seaweed()
    bucket = unique_bucket_name("kfs-bench-cluster")
    s3.store(bucket).close()
    with contextlib.ExitStack() as stack:
        etcd = stack.enter_context(EtcdServer(ctx.work / "cluster-etcd", name="kafscale-bench-cluster"))
        log("  a 1-node Ray test cluster (two more nodes join after the single-node measurement)")
        ray_cluster = stack.enter_context(RayTestCluster(nodes=1, cpus_per_node=1))
        args = ["--etcd-endpoints", etcd.endpoint, "--etcd-prefix", f"/bench-cluster-{os.getpid()}/",
                "--s3-endpoint", s3.endpoint_url, "--s3-bucket", bucket, "--s3-region", s3.region,
                "--s3-access-key", s3.access_key, "--s3-secret-key", s3.secret_key,
                "--ray-address", ray_cluster.address, "--shards-per-node", "1", "--flush-interval-ms", "50"]
        # Nodes share 127.0.0.1, so each shard takes a port slot of its own; a replacement node may take a new
        # slot while Ray still calls the killed node alive: spare ports.
        serve = ServeProcess(ctx.work / "cluster-data", shards=NODES, ports=_free_ports(2 * NODES),
                             extra_args=args, log_path=ctx.work / "cluster-serve.log")
        t0 = time.monotonic()
        serve.start(timeout=180)
        stack.callback(_stop_serve, serve)
        ctl = Control(ray_cluster.address)
        stack.callback(ctl.ray.shutdown)
        settings: dict[str, Any] = {
            "backend": "seaweedfs", "metadata": "etcd", "ray_nodes": NODES, "shards_per_node": 1,
            "cpus_per_ray_node": 1, "flush_interval_ms": 50, "machine_cpus": len(os.sched_getaffinity(0)),
            "serve_args": [a for a in args if "secret" not in a], "startup_s": round(time.monotonic() - t0, 2)}
        _throughput(ctx, serve, ray_cluster, ctl, settings)

        topic = "cluster-traffic"
        run_worker("create_topics", {"bootstrap": serve.bootstrap, "topics": [[topic, parts]]})
        traffic = Traffic(ctx, serve.bootstrap, topic, parts)
        stack.callback(traffic.kill)
        time.sleep(1.0)
        quiet = (time.monotonic(), time.monotonic() + 3.0)
        time.sleep(3.0)
        moves: list[dict[str, Any]] = []
        for _ in range(rounds):  # every partition to the next live shard, one at a time
            live = sorted(s["id"] for s in ctl.shards() if s["live"])
            where = {int(p.rsplit("-", 1)[1]): s["id"] for s in ctl.shards() for p in s["partitions"]
                     if p.rsplit("-", 1)[0] == topic}
            for p in range(parts):
                began = time.monotonic()
                r = ctl("move", topic, p, live[(live.index(where[p]) + 1) % len(live)])
                moves.append({**r, "began": began, "returned": time.monotonic()})
                time.sleep(0.5)
        # Every move's window closed (each partition acknowledged after it) before a kill can lengthen a pause.
        traffic.wait_served(time.monotonic() + REROUTE_S, 60)
        kill_log, rebalances = _kills(ray_cluster, ctl, traffic, topic, kills)
        final = traffic.stop()
    _report(ctx, settings, topic, parts, final, quiet, moves, rebalances, kill_log)


def _throughput(ctx: Context, serve: ServeProcess, ray_cluster: Any, ctl: Control, settings: dict[str, Any]) -> None:
    topic = "cluster-throughput"
    duration = 2.0 if ctx.quick else float(ctx.options.get("duration", 5.0))
    run_worker("create_topics", {"bootstrap": serve.bootstrap, "topics": [[topic, 6]]})
    one = {label: _produce(serve.bootstrap, topic, idem, duration) for label, idem in PRODUCERS}
    for _ in range(NODES - 1):
        ray_cluster.add_node()
    joined = ctl.wait_shards(NODES)
    spread = [m for m in ctl("rebalance") if m["topic"]]
    time.sleep(2.0)
    three = {label: _produce(serve.bootstrap, topic, idem, duration) for label, idem in PRODUCERS}
    refs = (ctx.limit_ref("put:seaweedfs", "raw 4 MiB PUT on seaweedfs, same run")
            + ctx.limit_ref("loopback_tcp_mib_s", "loopback TCP, same run"))
    for label, idem in PRODUCERS:
        tput = {**settings, "topic": topic, "partitions": 6, "record_bytes": 1024, "duration_s": duration,
                "warmup_s": 1.0, "producers": 1, "client": f"produce worker, acks=all, enable.idempotence={idem}"}
        a, b = one[label], three[label]
        ctx.add(Result("cluster", f"throughput{label}_1_node_mib_s", a["mib_per_s"], "MiB/s", "seaweedfs", refs,
                       {**tput, "ray_nodes": 1}, {"client": a}))
        single = Reference("limit", a["mib_per_s"], "MiB/s", "higher",
                           "1 node (1 shard), same run, same topic, producer, etcd and S3")
        ctx.add(Result("cluster", f"throughput{label}_3_nodes_mib_s", b["mib_per_s"], "MiB/s", "seaweedfs",
                       [single, *refs], tput, {"client": b, "nodes_joined_s": round(joined, 2), "rebalance": spread}))


def _kills(ray_cluster: Any, ctl: Control, traffic: Traffic, topic: str,
           kills: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """SIGKILL a worker node holding partitions, wait until every partition is served, add a node, rebalance."""
    kill_log: list[dict[str, Any]] = []
    rebalances: list[dict[str, Any]] = []
    for k in range(kills):
        info = ctl("info")
        spared = {info["controller"]["node_id"], ray_cluster.head_id()}
        mine = {n["node_id"]: sorted(p for s in n["shards"] for p in s["partitions"] if p.startswith(topic + "-"))
                for n in info["nodes"] if n["node_id"] and n["node_id"] not in spared}
        victim = next((node for node, held in mine.items() if held), None)
        if victim is None:
            log(f"  kill {k + 1}: no worker node (not the head's, not the controller's) holds a partition")
            break
        killed = time.monotonic()
        ray_cluster.kill_node(victim)
        healed = traffic.wait_served(killed, 60)
        log(f"  kill {k + 1}/{kills}: node {victim[:8]} with {mine[victim]};"
            f" {'served again' if healed else 'NOT served again within 60 s'} after"
            f" {time.monotonic() - killed:.1f} s (as the harness saw it)")
        ray_cluster.add_node()
        back = ctl.wait_shards(NODES)
        began = time.monotonic()
        done = ctl("rebalance")
        rebalances += [{**m, "began": began, "returned": time.monotonic()} for m in done if m["topic"] == topic]
        kill_log.append({"killed": killed, "node_id": victim, "partitions": mine[victim],
                         "node_back_s": round(back, 2), "rebalance_moves": len(done)})
        traffic.wait_served(time.monotonic() + REROUTE_S, 60)  # the rebalance's windows closed
    return kill_log, rebalances


def _report(ctx: Context, settings: dict[str, Any], topic: str, parts: int, final: dict[str, Any],
            quiet: tuple[float, float], moves: list[dict[str, Any]], rebalances: list[dict[str, Any]],
            kill_log: list[dict[str, Any]]) -> None:
    from kafscale.cluster.membership import LEASE_TTL_S

    gaps, last = final["gaps"], final["last"]

    def pauses(done: list[dict[str, Any]]) -> list[float]:
        out = []
        for m in (m for m in done if m["moved"]):
            out.append(pause(gaps[m["partition"]], last[m["partition"]], m["began"], m["returned"] + REROUTE_S))
            m["pause_s"] = _finite(out[-1], 3)
        return out

    move_pauses, rebalance_pauses = pauses(moves), pauses(rebalances)
    healing = []
    for kl in kill_log:
        killed = kl.pop("killed")
        per = [served_after(gaps[p], last[p], killed) for p in range(parts)]
        healing.append(max(per))
        kl.update(healing_s=_finite(max(per)), per_partition_s=[_finite(v, 3) for v in per])
    check = {"acked": sum(final["acked"]), "high_watermarks": sum(final["high_watermarks"]),
             "every_partition_equal": final["acked"] == final["high_watermarks"], "unacked": final["unacked"],
             "errors": final["errors"], "first_errors": final["first_errors"]}
    if not check["every_partition_equal"] or final["errors"]:
        log(f"  acknowledged and stored records differ, or errors: {check}")
    settings = {**settings, "topic": topic, "partitions": parts, "record_bytes": 1024,
                "client": {"library": "confluent-kafka (librdkafka)", **CLIENT}, "gap_resolution_s": GAP_S,
                "move_window_after_call_s": REROUTE_S, "traffic_mib_s": round(final["mib_per_s"], 2)}
    floor = Reference("limit", max(pause(gaps[p], last[p], *quiet) for p in range(parts)), "s", "lower",
                      "longest wait for an acknowledgement of any partition in a quiet 3 s (no move), same run")

    def add(name: str, value: float | None, refs: list[Reference], extra: dict[str, Any]) -> None:
        ctx.add(Result("cluster", name, _finite(value), "s", "seaweedfs", refs, settings,
                       {**extra, "exactly_once_check": check}))

    pause_refs = [Reference("target", PAUSE_TARGET_S, "s", "lower", "per-partition produce pause in a planned"
                            " move, p99"), floor]
    ms, rs, hs = _summary(move_pauses), _summary(rebalance_pauses), _summary(healing)
    add("move_pause_p50_s", ms["p50"], pause_refs, {"pauses": ms, "moves": moves})
    add("move_pause_p99_s", ms["p99"], pause_refs, {"pauses": ms})
    add("rebalance_move_pause_p99_s", rs["p99"], pause_refs,
        {"pauses": rs, "moves": rebalances, "note": "`rebalance` after a node joined: up to 4 moves at once"})
    heal_refs = [Reference("target", HEAL_TARGET_S, "s", "lower", "every partition served again after a SIGKILL"),
                 Reference("limit", LEASE_TTL_S, "s", "lower", "shard lease TTL: how failure is detected (a setting)")]
    add("healing_p50_s", hs["p50"], heal_refs, {"healing": hs, "kills": kill_log})
    add("healing_max_s", hs["max"], heal_refs, {"healing": hs})


def _stop_serve(serve: ServeProcess) -> None:
    if serve.proc is not None and serve.proc.poll() is None:
        try:
            serve.terminate(timeout=90)
        except Exception:
            serve.kill()


if __name__ == "__main__":
    if sys.argv[1:2] != ["traffic"]:
        raise SystemExit("usage: python -m benchmarks.cluster traffic JSON (the scenario: python -m benchmarks)")
    traffic_worker(json.loads(sys.argv[2]))
