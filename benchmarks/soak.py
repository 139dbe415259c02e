"""The `soak` scenario (issue 23): does a broker stay bounded over time? Not a test: `make bench BENCH_ARGS="--scenario
soak --soak-minutes 60"` (60 by default; --quick runs 3).

One `kafscale serve` (2 shards) on etcd and SeaweedFS, with the default compaction, janitor and snapshot
settings. Throughout: idempotent acks=all producers at a steady, moderate rate over many partitions; a consumer
group reading and committing; a topic with 2-minute retention written at the same rate; a short-lived topic
created, written and deleted every 30 s. Every SAMPLE_S it records the RSS of every process (the serve
process tree, etcd, SeaweedFS), etcd's database size and revision, the objects in the bucket against the
committed segments, the produce latency p50/p99 over the interval, and the group's lag.

The main topic keeps 10 minutes of data, the short one 2 minutes, so what is stored reaches a plateau. Targets,
after WARMUP of the run: RSS grows by less than 5% an hour; the metadata database and the object count grow by
less than 10% from the third quarter to the last, peak against peak (a plateau: retention makes the object count
a sawtooth, so a quarter's first sample says little); the produce p99 drifts by less than 20% (last quarter
against the second, medians). Each series is plotted over time in soak.png.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.cluster import _stop_serve
from benchmarks.common import Context, Reference, Result, log, process_tree_memory
from kafscale.testing.serve_process import ServeProcess

SAMPLE_S = 30.0
RATE = 200  # records a second, per producing topic (1 KiB each)
PARTITIONS = 24
RETENTION_MS = 600_000  # the main topic's: its objects and segment records reach a plateau after 10 minutes
RECORD = b"s" * 1024
WARMUP = 0.25  # the first quarter is warm-up
RSS_TARGET_PER_HOUR = 0.05
DRIFT_TARGET = 0.20
PLATEAU_TARGET = 0.10


def soak(ctx: Context) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    from kafscale.testing.etcd_server import EtcdServer
    from kafscale.testing.s3_servers import unique_bucket_name

    minutes = 3.0 if ctx.quick else float(ctx.options.get("soak_minutes") or 60)
    s3 = ctx.seaweed()
    bucket = unique_bucket_name("kfs-bench-soak")
    s3.store(bucket).close()
    prefix = f"/bench-soak-{os.getpid()}/"
    with contextlib.ExitStack() as stack:
        etcd = stack.enter_context(EtcdServer(ctx.work / "soak-etcd", name="kafscale-bench-soak"))
        args = ["--etcd-endpoints", etcd.endpoint, "--etcd-prefix", prefix, "--s3-endpoint", s3.endpoint_url,
                "--s3-bucket", bucket, "--s3-region", s3.region, "--s3-access-key", s3.access_key,
                "--s3-secret-key", s3.secret_key, "--orphan-grace-s", "300"]
        serve = ServeProcess(ctx.work / "soak-data", shards=2, extra_args=args, log_path=ctx.work / "soak-serve.log")
        serve.start(timeout=180)
        stack.callback(_stop_serve, serve)
        admin = AdminClient({"bootstrap.servers": serve.bootstrap_all})
        made = admin.create_topics([NewTopic("soak", PARTITIONS, config={"retention.ms": str(RETENTION_MS)}),
                                    NewTopic("soak-short", 8, config={"retention.ms": "120000"})])
        for future in made.values():
            future.result(60)
        stop = threading.Event()
        load = Load(serve.bootstrap_all, stop)
        stack.callback(load.join)
        stack.callback(stop.set)
        load.start()
        samples: list[dict[str, float]] = []
        t0 = time.monotonic()
        end = t0 + minutes * 60
        while time.monotonic() < end:
            time.sleep(min(SAMPLE_S, max(0.0, end - time.monotonic())))
            sample = {"t_min": (time.monotonic() - t0) / 60, **load.interval(),
                      **_rss(serve, etcd, s3), **_stores(etcd.endpoint, prefix, s3, bucket)}
            samples.append(sample)
            log(f"soak: {sample['t_min']:.1f} min: rss {sample['rss_mib']:.0f} MiB (shards "
                f"{sample['shards_rss_mib']:.0f}), etcd "
                f"{sample['etcd_db_mib']:.1f} MiB (rev {sample['etcd_revision']:.0f}), objects "
                f"{sample['objects']:.0f} / committed {sample['committed_objects']:.0f}, p99 "
                f"{sample['p99_ms']:.0f} ms, lag {sample['lag']:.0f}, errors {sample['errors']:.0f}")
    _report(ctx, samples, minutes)


class Load:
    """Producers on two topics, a consumer group, and a topic made and deleted every 30 s, on threads."""

    def __init__(self, bootstrap: str, stop: threading.Event) -> None:
        self.bootstrap, self.stop = bootstrap, stop
        self._lock = threading.Lock()
        self._latencies: list[float] = []
        self._errors = 0
        self._consumed = 0
        self.lag = 0
        self._threads = [threading.Thread(target=self._produce, args=(t,), daemon=True)
                         for t in ("soak", "soak-short")]
        self._threads += [threading.Thread(target=self._consume, daemon=True),
                          threading.Thread(target=self._churn, daemon=True)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def join(self) -> None:
        for t in self._threads:
            t.join(30)

    def interval(self) -> dict[str, float]:
        with self._lock:
            latencies, self._latencies = sorted(self._latencies), []
            errors, consumed = self._errors, self._consumed
        def q(f: float) -> float:
            return latencies[min(len(latencies) - 1, int(f * len(latencies)))] if latencies else 0.0

        return {"p50_ms": q(0.5), "p99_ms": q(0.99), "produced": float(len(latencies)), "errors": float(errors),
                "consumed": float(consumed), "lag": float(self.lag)}

    def _produce(self, topic: str) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": True,
                             "linger.ms": 5})

        def done(started: float) -> Callable[[Any, Any], None]:
            def record(err: Any, _msg: Any) -> None:
                with self._lock:
                    if err is None:
                        self._latencies.append((time.monotonic() - started) * 1000)
                    else:
                        self._errors += 1
            return record

        next_at = time.monotonic()
        while not self.stop.is_set():
            next_at += 1 / RATE
            producer.produce(topic, RECORD, on_delivery=done(time.monotonic()))
            producer.poll(0)
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        producer.flush(30)

    def _consume(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "soak", "auto.offset.reset": "earliest",
                             "enable.auto.commit": True, "auto.commit.interval.ms": 1000})
        consumer.subscribe(["soak"])
        last_lag = time.monotonic()
        try:
            while not self.stop.is_set():
                got = [m for m in consumer.consume(1000, 0.5) if m.error() is None]
                with self._lock:
                    self._consumed += len(got)
                if time.monotonic() - last_lag > 10:
                    last_lag = time.monotonic()
                    mine = consumer.assignment()
                    if mine:
                        committed = consumer.committed(mine, 10)
                        lag = 0
                        for tp in committed:
                            _, high = consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), 10)
                            lag += high - max(tp.offset, 0)
                        self.lag = lag
        finally:
            consumer.close()

    def _churn(self) -> None:
        from confluent_kafka import Producer
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        while not self.stop.wait(30):
            name = f"churn-{uuid.uuid4().hex[:8]}"
            try:
                admin.create_topics([NewTopic(name, 4)])[name].result(30)
                producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all"})
                for i in range(100):
                    producer.produce(name, RECORD, partition=i % 4)
                producer.flush(30)
                admin.delete_topics([name])[name].result(30)
            except Exception as e:
                log(f"soak: topic churn failed: {e}")
                with self._lock:
                    self._errors += 1


def _rss(serve: ServeProcess, etcd: Any, s3: Any) -> dict[str, float]:
    """RSS in MiB: every process of the broker (serve, its private Ray head's session: GCS, raylet, the
    controller and the shards), the shards alone, etcd and SeaweedFS."""
    assert serve.proc is not None
    memory = process_tree_memory(serve.proc.pid)
    shards = sum(p["rss_kib"] for p in memory["by_process"] if "ShardActor" in p["cmd"]) / 1024
    return {"rss_mib": memory["rss_bytes"] / 2**20, "shards_rss_mib": shards,
            "etcd_rss_mib": _vm_rss(etcd.pid) if etcd.pid else 0.0, "s3_rss_mib": _vm_rss(s3.pid) if s3.pid else 0.0}


def _vm_rss(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _stores(endpoint: str, prefix: str, s3: Any, bucket: str) -> dict[str, float]:
    from kafscale.storage.etcd_store import EtcdStore

    async def metadata() -> tuple[float, float, float]:
        store = EtcdStore(endpoint, prefix=prefix)
        try:
            status = await store.status()
            segments = [kv for kv in await store.range("partitions/") if "/segments/" in kv.key]
            return status.db_bytes / 2**20, float(status.revision), float(len(segments))
        finally:
            await store.close()

    db_mib, revision, segments = asyncio.run(metadata())
    store = s3.store(bucket, create_bucket=False)
    try:
        objects = sum(1 for o in store.list("default/") if "/@metadata/" not in o.key)
    finally:
        store.close()
    return {"etcd_db_mib": db_mib, "etcd_revision": revision, "objects": float(objects),
            "committed_objects": 2 * segments}


def _report(ctx: Context, samples: list[dict[str, float]], minutes: float) -> None:
    if len(samples) < 4:
        raise RuntimeError(f"soak: only {len(samples)} samples; run at least {4 * SAMPLE_S / 60:.0f} minutes")
    n = len(samples)
    q2 = samples[n // 4: n // 2] or samples[:1]
    q3 = samples[n // 2: 3 * n // 4] or samples[:1]
    q4 = samples[3 * n // 4:] or samples[-1:]
    warm = samples[int(n * WARMUP):]
    hours = max((warm[-1]["t_min"] - warm[0]["t_min"]) / 60, 1e-9)
    rss_growth = (warm[-1]["rss_mib"] - warm[0]["rss_mib"]) / warm[0]["rss_mib"] / hours
    p99_drift = statistics.median(s["p99_ms"] for s in q4) / max(statistics.median(s["p99_ms"] for s in q2), 1e-9) - 1
    settings = {"minutes": minutes, "rate_per_topic": RATE, "partitions": PARTITIONS, "sample_s": SAMPLE_S}
    series = {k: [round(s[k], 3) for s in samples] for k in samples[0]}
    ctx.add(Result("soak", "rss_growth_per_hour", round(rss_growth, 4), "fraction", "seaweedfs",
                   [Reference("target", RSS_TARGET_PER_HOUR, "fraction", "lower", "RSS growth per hour after warm-up")],
                   settings, {"series": series}))
    ctx.add(Result("soak", "p99_drift", round(p99_drift, 4), "fraction", "seaweedfs",
                   [Reference("target", DRIFT_TARGET, "fraction", "lower", "p99, last quarter against the second")],
                   settings))
    for name in ("etcd_db_mib", "objects"):  # a plateau: the last quarter's peak no higher than the third's
        growth = max(s[name] for s in q4) / max(max(s[name] for s in q3), 1e-9) - 1
        ctx.add(Result("soak", f"{name}_growth_last_quarter", round(growth, 4), "fraction", "seaweedfs",
                       [Reference("target", PLATEAU_TARGET, "fraction", "lower",
                                  "peak of the last quarter against the third's")],
                       settings, {"q2_max": max(s[name] for s in q2), "q3_max": max(s[name] for s in q3),
                                  "q4_max": max(s[name] for s in q4),
                                  "q4_median": statistics.median(s[name] for s in q4)}))
    ctx.add(Result("soak", "produce_errors", sum(s["errors"] for s in samples[-1:]), "count", "seaweedfs", [],
                   settings))
    _plot(ctx.out, samples)


def _plot(out: Path, samples: list[dict[str, float]]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("soak: matplotlib is not installed: no plot")
        return
    panels = [("rss_mib", "RSS of every broker process (MiB); the shards alone"),
              ("etcd_db_mib", "etcd database (MiB)"), ("objects", "objects in the bucket"),
              ("p99_ms", "produce p99 (ms)"), ("lag", "group lag (records)")]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.2 * len(panels)), sharex=True)
    t = [s["t_min"] for s in samples]
    for ax, (key, title) in zip(axes, panels, strict=True):
        ax.plot(t, [s[key] for s in samples])
        if key == "rss_mib":
            ax.plot(t, [s["shards_rss_mib"] for s in samples], label="shards")
            ax.legend()
        if key == "objects":
            ax.plot(t, [s["committed_objects"] for s in samples], label="committed")
            ax.legend()
        if key == "p99_ms":
            ax.plot(t, [s["p50_ms"] for s in samples], label="p50")
            ax.legend()
        ax.set_title(title, fontsize=9)
    axes[-1].set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(out / "soak.png", dpi=100)
    plt.close(fig)
