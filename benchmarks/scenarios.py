"""The benchmark scenarios. Each takes the run Context, starts what it needs and adds Results to it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks.autoscale import autoscale
from benchmarks.cluster import cluster
from benchmarks.common import (
    REPO,
    Broker,
    Context,
    MiB,
    Reference,
    Result,
    Worker,
    broker,
    drop_page_cache,
    loadavg,
    log,
    metrics_delta,
    run_worker,
)
from benchmarks.compaction import compaction, compaction_soak
from benchmarks.fetch_sessions import fetch_sessions
from benchmarks.group_protocols import group_protocols
from benchmarks.idempotent import idempotent
from benchmarks.metadata_scale import metadata_scale
from benchmarks.object_requests import object_requests
from benchmarks.read_back import read_back
from benchmarks.security import security
from benchmarks.soak import soak
from benchmarks.spark_kafka import spark_kafka
from benchmarks.transactions import transactions
from benchmarks.virtual_partitions import virtual
from benchmarks.vs_kafka import vs_kafka

GiB = 1024 * MiB

# The specification project's published kcat figures (docs/benchmarks/README.md, "Local Run (2026-01-03)").
PUBLISHED = {
    "end_to_end": 553.0,
    "produce_backlog": 4115.0,
    "consume_from_beginning": 1117.0,
    "cross_partition_produce": 7500.0,
    "cross_partition_consume": 1629.0,
}


def _target(value: float, unit: str, better: str, description: str) -> Reference:
    return Reference("target", value, unit, better, description)


def _limit(value: float, unit: str, description: str, better: str = "higher") -> Reference:
    return Reference("limit", value, unit, better, description)


def _shared(ctx: Context, backend: str) -> Broker:
    """One long-lived broker per backend for the scenarios that only add topics (produce, e2e, kcat)."""
    key = f"shared:{backend}"
    b = ctx.options.setdefault("_brokers", {}).get(key)
    if b is None:
        log(f"starting the shared broker on {backend}")
        b = Broker(ctx, backend, "shared").start()
        ctx.options["_brokers"][key] = b
    return b


def _wait_all_idle(ctx: Context) -> float:
    """Before a measured case: wait until every shared broker has flushed what it buffered (an acks=1
    case leaves a backlog that would be uploaded during the next case), then write back the page cache's
    dirty data. SeaweedFS writes through the page cache, and the dirty gigabytes it leaves behind made
    the local store's fsyncs (segments, SQLite) wait behind their writeback: the local end-to-end
    acks=all p99 was 266-509 ms right after the SeaweedFS produce cases, 75-83 ms in runs without them.
    Returns the seconds waited."""
    waited = sum(b.wait_idle() for b in ctx.options.get("_brokers", {}).values())
    t0 = time.monotonic()
    os.sync()
    return waited + time.monotonic() - t0


def close_shared(ctx: Context) -> None:
    for b in ctx.options.get("_brokers", {}).values():
        with contextlib.suppress(Exception):
            b.stop()
    ctx.options["_brokers"] = {}


def _create(b: Broker, topics: list[tuple[str, int]], batch: int = 10) -> dict[str, Any]:
    r = run_worker("create_topics", {"bootstrap": b.bootstrap, "topics": topics, "batch": batch}, timeout=1800)
    real = [e for e in r["errors"] if "already exists" not in e.lower()]
    if real:
        raise RuntimeError(f"create topics failed: {real[:5]}")
    return r


def _lat_refs(ctx: Context, flush_ms: float, p50: float | None = None, p99: float | None = None) -> dict[str, list]:
    floor = _limit(flush_ms, "ms", "flush interval: the wait a record can have before its segment is flushed",
                   better="lower")
    return {
        "p50_ms": ([_target(p50, "ms", "lower", "acks=all/end-to-end p50 target")] if p50 else []) + [floor],
        "p99_ms": ([_target(p99, "ms", "lower", "acks=all p99 target")] if p99 else []) + [floor],
        "p999_ms": [floor],
    }


# -- 6. limits ----------------------------------------------------------------------------------------------


def limits(ctx: Context) -> None:
    """Loopback TCP and raw 4 MiB PUT/GET through each store backend: the ceilings the broker works under."""
    duration = 1.5 if ctx.quick else 3.0
    recv = Worker("tcp_recv", {})
    try:
        port = recv.read_line(30)["port"]
        send = run_worker("tcp_send", {"port": port, "duration": duration})
        got = recv.result(60)
    finally:
        recv.kill()
    ctx.limits["loopback_tcp_mib_s"] = got["mib_per_s"]
    ctx.add(Result("limits", "loopback_tcp", got["mib_per_s"], "MiB/s", "loopback",
                   [_limit(got["mib_per_s"], "MiB/s", "itself: one sender/receiver process pair over 127.0.0.1")],
                   {"chunk_bytes": MiB, "duration_s": duration}, {"sender": send, "receiver": got}))
    for backend in ctx.backends:
        params = _store_limit_params(ctx, backend, [1, 2, 4])
        r = run_worker("store_limits", params, timeout=900)
        if backend == "local":
            shutil.rmtree(ctx.work / "limits-local", ignore_errors=True)
        for op in ("put", "get", "cold_get"):
            best_threads, best = max(((t, v[f"{op}_mib_s"] or 0.0) for t, v in r.items()), key=lambda kv: kv[1])
            ctx.limits[f"{op}:{backend}"] = best
            if op == "put":  # the raw PUTs beside the produce cases use it
                ctx.options.setdefault("_put_threads", {})[backend] = int(best_threads)
            ctx.add(Result("limits", f"raw_{op}_4MiB", best, "MiB/s", backend,
                           ctx.limit_ref("loopback_tcp_mib_s", "loopback TCP, same run"),
                           {**params, "best_threads": int(best_threads)}, {"by_threads": r}))


def _store_limit_params(ctx: Context, backend: str, threads: list[int]) -> dict[str, Any]:
    params: dict[str, Any] = {"backend": backend, "object_mib": 4, "count": 8 if ctx.quick else 24,
                              "threads": threads}
    if backend == "local":
        root = ctx.work / "limits-local"
        params["root"] = str(root)
        params["drop_dir"] = str(root)
    else:
        s3 = ctx.seaweed()
        bucket = ctx.options.setdefault("_limit_bucket", f"kfs-bench-limits-{int(time.time())}")  # one per run
        params.update(endpoint=s3.endpoint_url, bucket=bucket, access_key=s3.access_key, secret_key=s3.secret_key,
                      drop_dir=str(ctx.work / "seaweed"))
    return params


def _raw_put_now(ctx: Context, backend: str) -> float | None:
    """The raw 4 MiB PUT rate right now (the limits scenario's best thread count): the reference taken
    beside a produce case. This VM's speed drifts by up to 2x within minutes, so a limit measured at the
    start of the run can be far from the one the case ran under."""
    threads = ctx.options.get("_put_threads", {}).get(backend)
    if threads is None:
        return None
    try:
        r = run_worker("store_limits", {**_store_limit_params(ctx, backend, [threads]), "put_only": True},
                       timeout=300)
        return float(r[str(threads)]["put_mib_s"])
    except Exception as e:  # the case keeps its run-start reference instead
        log(f"  raw PUT beside the case failed: {e}")
        return None


# -- 1. produce throughput -----------------------------------------------------------------------------------


def produce(ctx: Context) -> None:
    sizes = [100, 1024]
    acks_list = ["all", "1"]
    parts_list = [1, 4, 16]
    duration = 2.0 if ctx.quick else float(ctx.options.get("duration", 5.0))
    warmup = 1.0
    matrix = [(s, a, p) for s in sizes for a in acks_list for p in parts_list]
    if ctx.quick:
        matrix = [(1024, "all", 4), (1024, "1", 4), (100, "all", 1)]
    for backend in ctx.backends:
        b = _shared(ctx, backend)
        topics = [(f"produce-{s}-acks{a}-p{p}", p) for s, a, p in matrix]
        _create(b, topics)
        for (size, acks, parts), (topic, _) in zip(matrix, topics, strict=True):
            settings = {**b.settings, "topic": topic, "record_bytes": size, "acks": acks, "partitions": parts,
                        "batch_size": MiB, "linger_ms": 5, "queue_kbytes": 32 * 1024, "duration_s": duration,
                        "warmup_s": warmup, "producers": 1}
            # The SeaweedFS target is relative to the raw PUT rate: measure it right before and after.
            # Before the wait: its sync also writes back what SeaweedFS took for the raw PUTs.
            beside = backend != "local" and size == 1024 and acks == "all"
            put_before = _raw_put_now(ctx, backend) if beside else None
            drained = _wait_all_idle(ctx)
            m0 = b.metrics()
            r = run_worker("produce", {"bootstrap": b.bootstrap, "topic": topic, "partitions": parts, "size": size,
                                       "acks": acks, "duration": duration, "warmup": warmup}, timeout=600)
            broker_side = metrics_delta(m0, b.metrics())
            put_after = _raw_put_now(ctx, backend) if beside else None
            label = f"{size}B_acks{acks}_p{parts}"
            wire = ctx.limit_ref("loopback_tcp_mib_s", "loopback TCP, same run")
            put = ctx.limit_ref(f"put:{backend}", f"raw 4 MiB PUT on {backend}, same run")
            mib_refs = list(put) + list(wire)
            if size == 1024 and acks == "all":
                if backend == "local":
                    mib_refs.insert(0, _target(200.0, "MiB/s", "higher", "1 KiB acks=all on the local store"))
                elif put_before is not None and put_after is not None:
                    raw = (put_before + put_after) / 2
                    settings["raw_put_beside_mib_s"] = [round(put_before, 1), round(put_after, 1)]
                    mib_refs[:0] = [_target(0.8 * raw, "MiB/s", "higher",
                                            "80% of raw 4 MiB PUT, mean of the runs just before and after"),
                                    _limit(raw, "MiB/s", f"raw 4 MiB PUT on {backend} beside this case")]
                elif put:
                    mib_refs.insert(0, _target(0.8 * put[0].value, "MiB/s", "higher",
                                               "80% of raw 4 MiB PUT at the start of the run (none beside the case)"))
            extra = {"client": {k: v for k, v in r.items() if k != "latency"}, "latency": r["latency"],
                     "broker_metrics": broker_side, "waited_for_idle_broker_s": round(drained, 1)}
            ctx.add(Result("produce", f"{label}_mib_s", r["mib_per_s"], "MiB/s", backend, mib_refs, settings, extra))
            rec_refs = [_limit(ref.value * MiB / size, "records/s", ref.description + f" / {size} B")
                        for ref in (wire + put)]
            ctx.add(Result("produce", f"{label}_records_s", r["records_per_s"], "records/s", backend, rec_refs,
                           settings))
            refs = _lat_refs(ctx, 50.0, 60.0 if acks == "all" else None, 150.0 if acks == "all" else None)
            for q in ("p50_ms", "p99_ms", "p999_ms"):
                ctx.add(Result("produce", f"{label}_latency_{q}", r["latency"][q], "ms", backend, refs[q],
                               {**settings, "note": "saturating load: includes client queueing"}))
            if r["errors"]:
                log(f"  {r['errors']} delivery errors, first: {r['first_error']}")


# -- 2. end-to-end latency ---------------------------------------------------------------------------------------


def end_to_end(ctx: Context) -> None:
    rate = float(ctx.options.get("e2e_rate", 1000))
    size, parts = 1024, 4
    duration, warmup = (4.0, 1.0) if ctx.quick else (10.0, 2.0)
    for backend in ctx.backends:
        b = _shared(ctx, backend)
        topic = f"e2e-{int(time.time())}"
        _create(b, [(topic, parts)])
        expect = int(rate * (duration + warmup) * 0.98)
        consumer = Worker("e2e_consume", {"bootstrap": b.bootstrap, "topic": topic, "partitions": parts,
                                          "expect": expect, "timeout": duration + warmup + 30,
                                          "skip_first_s": warmup + 1.0})
        try:
            consumer.read_line(60)
            _wait_all_idle(ctx)
            m0 = b.metrics()
            prod = run_worker("produce", {"bootstrap": b.bootstrap, "topic": topic, "partitions": parts,
                                          "size": size, "acks": "all", "duration": duration, "warmup": warmup,
                                          "rate": rate, "timestamp_payload": True}, timeout=300)
            cons = consumer.result(120)
            broker_side = metrics_delta(m0, b.metrics())
        finally:
            consumer.kill()
        settings = {**b.settings, "topic": topic, "rate_records_s": rate, "record_bytes": size, "partitions": parts,
                    "acks": "all", "linger_ms": 5, "duration_s": duration, "warmup_s": warmup,
                    "consumer": "confluent-kafka assign() at the high watermark, fetch.wait.max.ms=100"}
        refs = _lat_refs(ctx, 50.0, 100.0)
        for q in ("p50_ms", "p99_ms", "p999_ms"):
            ctx.add(Result("end_to_end", f"e2e_latency_{q}", cons["latency"][q], "ms", backend,
                           refs[q], settings,
                           {"received": cons["received"], "latency": cons["latency"], "broker_metrics": broker_side}
                           if q == "p50_ms" else {}))
        prefs = _lat_refs(ctx, 50.0, 60.0, 150.0)
        for q in ("p50_ms", "p99_ms", "p999_ms"):
            ctx.add(Result("end_to_end", f"produce_acks_all_at_rate_latency_{q}", prod["latency"][q], "ms", backend,
                           prefs[q], settings, {"latency": prod["latency"]} if q == "p50_ms" else {}))


# -- 3. cold catch-up read ------------------------------------------------------------------------------------


def catchup(ctx: Context) -> None:
    close_shared(ctx)  # the long-lived brokers are done: give this one the whole machine
    record = 16 * 1024
    parts = 4
    for backend in ctx.backends:
        if ctx.quick and backend != "local":
            log("  --quick: the catch-up read runs on the local store only")
            continue
        if ctx.quick:
            backlog_mib = 64
        else:
            default = 2048 if backend == "local" else 512
            backlog_mib = int(ctx.options.get("backlog_mib") or default)
            if backend != "local" and ctx.options.get("backlog_mib"):
                backlog_mib = min(backlog_mib, 512)
        count = backlog_mib * MiB // record
        with broker(ctx, backend, "catchup") as b:
            topic = "catchup"
            _create(b, [(topic, parts)])
            log(f"  writing a {backlog_mib} MiB backlog ({count} x {record} B)")
            w = run_worker("produce", {"bootstrap": b.bootstrap, "topic": topic, "partitions": parts, "size": record,
                                       "acks": "1", "count": count, "duration": 0, "warmup": 0,
                                       "queue_kbytes": 256 * 1024}, timeout=3600)
            restart_s = b.restart()
            if backend == "local":
                dropped = drop_page_cache(b.dir / "data" / "objects")
            else:
                dropped = drop_page_cache(ctx.work / "seaweed")
            r = run_worker("catchup", {"bootstrap": b.bootstrap, "topic": topic, "partitions": parts,
                                       "expect": count, "timeout": 1800}, timeout=1900)
            settings = {**b.settings, "backlog_mib": backlog_mib, "record_bytes": record, "partitions": parts,
                        "cold": "broker restarted after writing; posix_fadvise(DONTNEED) on the stored files",
                        "page_cache_bytes_advised": dropped, "restart_s": round(restart_s, 2)}
            refs = []
            if backend == "local":
                refs.append(_target(300.0, "MiB/s", "higher", "cold catch-up read"))
            refs += ctx.limit_ref(f"cold_get:{backend}", f"raw 4 MiB GET, page cache dropped, on {backend}, same run")
            refs += ctx.limit_ref("loopback_tcp_mib_s", "loopback TCP, same run")
            ctx.add(Result("catchup", "cold_read_mib_s", r["mib_per_s"], "MiB/s", backend, refs, settings,
                           {"reader": r, "writer": {k: v for k, v in w.items() if k != "latency"}}))
            wrefs = ctx.limit_ref(f"put:{backend}", f"raw 4 MiB PUT on {backend}, same run")
            ctx.add(Result("catchup", "backlog_write_acks1_16KiB_mib_s", w["mib_per_s"], "MiB/s", backend, wrefs,
                           settings))
            if not r["complete"]:
                log(f"  catch-up incomplete: {r['received']} of {count}")
        shutil.rmtree(b.dir, ignore_errors=True)


# -- 4. the specification project's kcat scenario -----------------------------------------------------------


def _kcat_produce(bootstrap: str, topic: str, n: int, size: int) -> float:
    line = b"x" * (size - 1) + b"\n"
    data = line * n
    t0 = time.monotonic()
    proc = subprocess.run(["kcat", "-P", "-b", bootstrap, "-t", topic, "-q"], input=data, capture_output=True,
                          timeout=300)
    elapsed = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"kcat -P failed: {proc.stderr.decode(errors='replace')[-2000:]}")
    return elapsed


def _kcat_consume_cmd(bootstrap: str, topic: str, n: int, offset: str, exit_at_end: bool = True) -> list[str]:
    # The published script passes -e also to the consumer that starts at "end"; that kcat exits at once
    # (every partition is at its end when it starts) and receives nothing, so ours waits for the N records.
    return ["kcat", "-C", "-b", bootstrap, "-t", topic, "-o", offset, "-c", str(n), *(["-e"] if exit_at_end else []),
            "-q"]


def _count_lines(out: bytes) -> int:
    return out.count(b"\n")


KCAT_ROUNDS = 3  # each step is one command of ~0.1-1 s: a single round swings by a flush window either way


def _kcat_round(b: Broker, n: int, size: int) -> dict[str, tuple[float, float, int]]:
    """One pass of the published script on fresh topics: name -> (msg/s, seconds, messages)."""
    suffix = f"{int(time.time() * 1000)}"
    hot, s3t = f"bench-hot-{suffix}", f"bench-s3-{suffix}"
    _create(b, [(hot, 3), (s3t, 2)])
    figures: dict[str, tuple[float, float, int]] = {}

    # Hot path: consumer from the end (1 s head start), then produce N; wall time of the whole block.
    t0 = time.monotonic()
    consumer = subprocess.Popen(_kcat_consume_cmd(b.bootstrap, hot, n, "end", False), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    time.sleep(1.0)
    _kcat_produce(b.bootstrap, hot, n, size)
    out, _ = consumer.communicate(timeout=120)
    wall = time.monotonic() - t0
    figures["end_to_end"] = (n / wall, wall, _count_lines(out))

    el = _kcat_produce(b.bootstrap, s3t, n, size)
    figures["produce_backlog"] = (n / el, el, n)
    t0 = time.monotonic()
    out = subprocess.run(_kcat_consume_cmd(b.bootstrap, s3t, n, "beginning"), capture_output=True,
                         timeout=300).stdout
    el = time.monotonic() - t0
    figures["consume_from_beginning"] = (n / el, el, _count_lines(out))

    el = _kcat_produce(b.bootstrap, hot, 2 * n, size)
    figures["cross_partition_produce"] = (2 * n / el, el, 2 * n)
    t0 = time.monotonic()
    out = subprocess.run(_kcat_consume_cmd(b.bootstrap, hot, 2 * n, "beginning"), capture_output=True,
                         timeout=300).stdout
    el = time.monotonic() - t0
    figures["cross_partition_consume"] = (2 * n / el, el, _count_lines(out))
    return figures


def kcat(ctx: Context) -> None:
    if shutil.which("kcat") is None:
        log("kcat not installed: scenario skipped (apt-get install kcat)")
        return
    n, size = 2000, 256
    for backend in ctx.backends:
        b = _shared(ctx, backend)
        rounds = [_kcat_round(b, n, size) for _ in range(KCAT_ROUNDS)]
        settings = {**b.settings, "records": n, "record_bytes": size, "topics": {"bench-hot-*": 3, "bench-s3-*": 2},
                    "rounds": KCAT_ROUNDS, "figure": "median over the rounds, each on fresh topics",
                    "client": "kcat (Debian, its own librdkafka) with default settings, as the published script",
                    "deviation": "the end-to-end consumer runs without -e (with it, kcat exits at once, empty)"}
        for name in rounds[0]:
            runs = sorted(r[name] for r in rounds)
            rate, seconds, messages = runs[len(runs) // 2]
            published = PUBLISHED[name]
            factor = 2.0 if name == "end_to_end" else 5.0
            refs = [_target(published * factor, "msg/s", "higher", f"{factor:g}x the published figure"),
                    _limit(published, "msg/s", "the published figure (Go Kafscale, kind, MinIO; not this machine)")]
            ctx.add(Result("kcat_spec", name, rate, "msg/s", backend, refs, settings,
                           {"seconds": seconds, "messages_received": messages,
                            "rounds": [{"msg_per_s": round(r[name][0], 1), "seconds": round(r[name][1], 4),
                                        "messages": r[name][2]} for r in rounds]}))


# -- 5. scale --------------------------------------------------------------------------------------------------


def scale(ctx: Context) -> None:
    close_shared(ctx)
    stages = [int(x) for x in ctx.options.get("scale_partitions") or ([1000] if ctx.quick else [1000, 10000])]
    per_topic = 250
    with broker(ctx, "local", "scale") as b:
        base_topic = "scale-base"
        _create(b, [(base_topic, 1)])
        iterations = 10 if ctx.quick else 20
        base = run_worker("metadata_latency", {"bootstrap": b.bootstrap, "topic": base_topic, "iterations": 30})
        mem0 = b.memory()
        ctx.add(Result("scale", "rss_bytes_1_partition", mem0["rss_bytes"], "bytes", "local",
                       [_target(4 * GiB, "bytes", "lower", "10,000 partitions in 4 GiB RSS")], b.settings,
                       {"memory": mem0}))
        created = 0
        topics_all: list[tuple[str, int]] = []
        for stage in stages:
            need = stage - created
            new = [(f"scale-{created // per_topic + i:04d}", per_topic) for i in range(need // per_topic)]
            log(f"  creating {need} partitions ({len(new)} topics of {per_topic}) in batches of 4 topics")
            cr = _create(b, new, batch=4)
            created = stage
            topics_all += new
            settings = {**b.settings, "partitions": stage, "partitions_per_topic": per_topic,
                        "create_batch_topics": 4, "create_s": round(cr["elapsed_s"], 2)}
            md = run_worker("metadata_latency", {"bootstrap": b.bootstrap, "topic": new[-1][0],
                                                 "iterations": iterations}, timeout=1800)
            mem = b.memory()
            rss_target = [_target(4 * GiB, "bytes", "lower", "10,000 partitions in 4 GiB RSS (all processes)")]
            ctx.add(Result("scale", f"rss_bytes_{stage}_partitions_created", mem["rss_bytes"], "bytes", "local",
                           [*rss_target, _limit(mem0["rss_bytes"], "bytes", "RSS with 1 partition, same broker",
                                                "lower")], settings, {"memory": mem}))
            for label in ("all_topics", "one_topic"):
                for q in ("p50_ms", "p99_ms"):
                    ref = [_limit(base[label][q], "ms", f"Metadata ({label}) with 1 partition, same broker",
                                  "lower")]
                    ctx.add(Result("scale", f"metadata_{label}_{q}_{stage}_partitions", md[label][q], "ms",
                                   "local", ref, settings, {"metadata": md[label]} if q == "p50_ms" else {}))
            log(f"  one record into each of the {stage} partitions (opens every partition owner)")
            touch = run_worker("touch_partitions", {"bootstrap": b.bootstrap, "topics": new}, timeout=3600)
            time.sleep(1.0)
            mem = b.memory()
            ctx.add(Result("scale", f"rss_bytes_{stage}_partitions_open", mem["rss_bytes"], "bytes", "local",
                           [*rss_target, _limit(mem0["rss_bytes"], "bytes", "RSS with 1 partition, same broker",
                                                "lower")], {**settings, "touch_s": round(touch["elapsed_s"], 2)},
                           {"memory": mem, "touch": touch}))
            ctx.add(Result("scale", f"open_partitions_per_s_{stage}", need / touch["elapsed_s"], "partitions/s",
                           "local", [], settings, {"touch": touch}))
    shutil.rmtree(b.dir, ignore_errors=True)


# -- scenarios other engineers own ----------------------------------------------------------------------------


def _external(ctx: Context, module: str) -> None:
    path = REPO / "benchmarks" / f"{module}.py"
    if not path.exists():
        log(f"benchmarks/{module}.py not present: skipped")
        return
    close_shared(ctx)
    args = [sys.executable, "-m", f"benchmarks.{module}"]
    source = path.read_text(errors="replace")
    env = dict(os.environ)
    if ctx.quick:
        if "--quick" in source:
            args.append("--quick")
        elif "--runs" in source:
            args += ["--runs", "2"]
        env["KAFSCALE_BENCH_SEGMENTS"] = "5"
    t0 = time.monotonic()
    load0 = loadavg()
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=1200, env=env)
    elapsed = time.monotonic() - t0
    (ctx.out / f"{module}.stdout.txt").write_text(proc.stdout)
    (ctx.out / f"{module}.stderr.txt").write_text(proc.stderr)
    data: Any = None
    with contextlib.suppress(ValueError):
        data = json.loads(proc.stdout)
    if data is None:
        for line in reversed(proc.stdout.splitlines()):
            with contextlib.suppress(ValueError):
                data = json.loads(line)
                break
    settings = {"command": args[1:], "exit_code": proc.returncode, "loadavg_before": load0,
                "run_seconds": round(elapsed, 1)}
    if proc.returncode != 0 or not isinstance(data, dict):
        raise RuntimeError(f"benchmarks.{module} failed ({proc.returncode}): {proc.stderr[-1500:]}")
    # Their JSON carries its own figure, target and limit; lift them into a Result of ours.
    refs: list[Reference] = []
    value: float | None = None
    unit = "s"
    name = "figure"
    for key in ("target", "limit"):
        ref = data.get(key)
        if isinstance(ref, dict) and isinstance(ref.get("value"), int | float):
            refs.append(Reference(key, float(ref["value"]), str(ref.get("unit", "")), str(ref.get("better", "higher")),
                                  str(ref.get("what") or ref.get("description") or f"{module}'s own {key}")))
    figure = data.get("figure")
    if isinstance(figure, dict) and isinstance(figure.get("value"), int | float):
        value, name = float(figure["value"]), str(figure.get("name", "figure"))
        unit = refs[0].unit if refs else ""
    elif refs and isinstance(data.get("ratio_to_target"), int | float):
        value, unit, name = refs[0].value * float(data["ratio_to_target"]), refs[0].unit, "figure"
    else:
        value, name = elapsed, "run_seconds"
    loads = data.get("loadavg")
    result = Result(module, name, value, unit, "", refs, settings, {"output": data})
    if isinstance(loads, list) and loads:
        result.loadavg = [float(x) for x in loads]
    ctx.add(result)


def group_rebalance(ctx: Context) -> None:
    _external(ctx, "group_rebalance")


def pipeline_read(ctx: Context) -> None:
    _external(ctx, "pipeline_read")


SCENARIOS: dict[str, Callable[[Context], None]] = {
    "limits": limits,
    "produce": produce,
    "end_to_end": end_to_end,
    "kcat_spec": kcat,
    "catchup": catchup,
    "read_back": read_back,
    "fetch_sessions": fetch_sessions,
    "idempotent": idempotent,
    "object_requests": object_requests,
    "transactions": transactions,
    "compaction": compaction,
    "compaction_soak": compaction_soak,
    "scale": scale,
    "group_rebalance": group_rebalance,
    "group_protocols": group_protocols,
    "pipeline_read": pipeline_read,
    "metadata_scale": metadata_scale,
    "cluster": cluster,
    "autoscale": autoscale,
    "security": security,
    "soak": soak,
    "virtual": virtual,
    "vs_kafka": vs_kafka,
    "spark_kafka": spark_kafka,
}

ALIASES = {"vs-kafka": "vs_kafka", "group-protocols": "group_protocols", "spark-kafka": "spark_kafka",
           "e2e": "end_to_end", "kcat": "kcat_spec", "catch-up": "catchup", "catch_up": "catchup"}


def resolve(name: str) -> str:
    name = ALIASES.get(name, name)
    if name not in SCENARIOS:
        raise SystemExit(f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}")
    return name


def scenario_results(ctx: Context, name: str) -> list[Result]:
    return [r for r in ctx.results if r.scenario == name]
