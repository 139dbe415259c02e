"""The `compaction` scenario (issue 34): what one cleaning pass costs, on a keyed log.

A log of `keys` distinct keys with 10 values each, in random order (1 M keys, 10 M records of 100-byte values; 100 k
keys with --quick), written straight into a local object directory; then one pass over it, with the broker's own
code, in a process of its own (benchmarks/compaction_worker.py). Reported:

* cleaning throughput, MiB of log per CPU-second (one pass runs on one core), beside the store's raw GET rate;
* the pass's peak memory over its process's baseline, against the bound it is built to keep: the key map
  (`ENTRY_BYTES` per key) and four segments' worth of bytes (the segment being read, the kept batches of the group
  being written, the new segment object assembled from them, and its index and write buffer);
* the reclaimed fraction of the log's bytes (with 10 values per key, at most 0.9 is there to reclaim);
* produce latency while a pass runs: a 2-shard `kafscale serve` holds a keyed topic (written with the delete
  policy); librdkafka produces at a fixed rate into another topic, once as the baseline and once right after the
  keyed topic is switched to compact, while its first pass runs (a Ray task beside the shards). The p99 over the
  baseline's (target: at most 1.1), with the passes' time in the window to show they overlapped.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Context, Reference, Result, broker, log, run_worker

VERSIONS = 10
SEGMENT_MIB = 4
MAP_ENTRIES = 1_000_000  # the broker's default --compaction-map-entries


def compaction(ctx: Context) -> None:
    _one_pass(ctx)
    _produce_latency_while_cleaning(ctx)


def _one_pass(ctx: Context) -> None:
    from kafscale.compaction.keymap import ENTRY_BYTES

    keys = 100_000 if ctx.quick else 1_000_000
    work = ctx.work / "compaction-log"
    settings: dict[str, Any] = {"keys": keys, "versions": VERSIONS, "segment_mib": SEGMENT_MIB,
                                "map_entries": MAP_ENTRIES, "value_bytes": 100, "records_per_batch": 500}
    try:
        built = run_worker("build_log", {**settings, "dir": str(work)}, timeout=7200)
        run = run_worker("clean_pass", {**settings, "dir": str(work), "segments": built["segments"],
                                        "now_ms": built["now_ms"]}, timeout=7200)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    mib = run["log_bytes"] / 2**20
    per_core = mib / run["cpu_s"]
    extra = run["rss_peak_mib"] - run["rss_before_mib"]
    bound = (min(keys, MAP_ENTRIES) * ENTRY_BYTES + 4 * SEGMENT_MIB * 2**20) / 2**20
    reclaimed = 1 - run["bytes_written"] / run["log_bytes"]
    log(f"  {built['records']:,} records, {mib:,.0f} MiB in {len(built['segments'])} segments: pass {run['wall_s']:.1f}"
        f" s wall, {run['cpu_s']:.1f} s CPU, {per_core:.1f} MiB/s per core; peak +{extra:.0f} MiB (bound"
        f" {bound:.0f}); kept {run['records_kept']:,} records, reclaimed {reclaimed:.3f}")
    extra_figures = {k: run[k] for k in ("cpu_s", "wall_s", "log_bytes", "bytes_written", "records_kept",
                                         "rss_before_mib", "rss_peak_mib")}
    ctx.add(Result("compaction", "cleaning_mib_s_per_core", per_core, "MiB/s", "local",
                   ctx.limit_ref("get:local", "raw GET from the local store"), settings, extra_figures))
    ctx.add(Result("compaction", "pass_peak_memory_over_baseline", extra, "MiB", "local",
                   [Reference("target", bound, "MiB", "lower", "the key map (ENTRY_BYTES per key) and four"
                              " segments' worth of bytes")], settings, extra_figures))
    ctx.add(Result("compaction", "reclaimed_fraction", reclaimed, "x", "local",
                   [Reference("target", 0.85, "x", "higher", "of 10 values per key, 9 go: 0.9 less the"
                              " per-batch overhead of what stays")], settings, extra_figures))


def _pass_figures(metrics: dict[str, dict[str, list[float]]]) -> tuple[float, float]:
    return tuple(metrics.get("kafscale_cleaner_pass_duration_seconds", {}).get("", [0.0, 0.0]))  # type: ignore


def _produce_latency_while_cleaning(ctx: Context) -> None:
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    keys, versions = (200_000, 5) if ctx.quick else (1_000_000, 10)
    rate, duration = (2_000, 5.0) if ctx.quick else (5_000, 20.0)
    keyed, plain = "compaction-keyed", "compaction-produce"
    with broker(ctx, "local", "compaction", extra_args=["--log-cleaner-backoff-ms", "500"]) as b:
        made = run_worker("create_topics", {"bootstrap": b.bootstrap, "topics": [(keyed, 1), (plain, 4)], "batch": 1})
        if made["errors"]:
            raise RuntimeError(f"create topics: {made['errors']}")
        filled = run_worker("produce_keyed", {"bootstrap": b.bootstrap, "topic": keyed, "keys": keys,
                                              "versions": versions}, timeout=3600)
        if filled["errors"] or filled["undelivered"]:
            raise RuntimeError(f"keyed fill: {filled}")
        b.wait_idle()
        produce = {"bootstrap": b.bootstrap, "topic": plain, "partitions": 4, "size": 1024, "rate": rate,
                   "duration": duration}
        baseline = run_worker("produce", produce, timeout=duration + 300)
        before = _pass_figures(b.metrics())
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        change = ConfigResource("topic", keyed, incremental_configs=[
            ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("min.cleanable.dirty.ratio", "0.01", incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([change])[change].result(30)
        during = run_worker("produce", produce, timeout=duration + 300)
        deadline = time.monotonic() + 600
        while (after := _pass_figures(b.metrics()))[1] <= before[1]:  # the pass that ran in the window, done
            if time.monotonic() > deadline:
                raise RuntimeError("no cleaning pass finished within 10 minutes of the switch to compact")
            time.sleep(1)
        settings: dict[str, Any] = {**b.settings, "keys": keys, "versions": versions, "rate": rate,
                                    "duration_s": duration, "record_bytes": 1024}
    p99, base99 = during["latency"]["p99_ms"], baseline["latency"]["p99_ms"]
    passes, pass_s = after[1] - before[1], after[0] - before[0]
    log(f"  produce p99 {base99:.1f} ms alone, {p99:.1f} ms while cleaning ({passes:.0f} pass(es) of {pass_s:.1f} s"
        f" from the switch on, beside the {duration:.0f} s window)")
    ctx.add(Result("compaction", "produce_p99_while_cleaning_over_alone", p99 / base99 if base99 else None, "x",
                   "local", [Reference("target", 1.1, "x", "lower", "a pass must not move the produce p99 by"
                                       " more than 10 %")], settings,
                   {"p99_alone_ms": base99, "p99_while_cleaning_ms": p99, "passes": passes, "pass_s": pass_s,
                    "records_s_alone": baseline["records_per_s"], "records_s_while": during["records_per_s"]}))


SOAK_KEYS = 10_000
SOAK_RATE = 2_000  # keyed 1 KiB records a second: the key set is rewritten every 5 s
SOAK_SAMPLE_S = 10.0


def _topic_bytes(root: Path, topic: str) -> int:
    """Bytes of every object of the topic in a local object directory (committed or not yet swept)."""
    return sum(f.stat().st_size for d in root.rglob(topic) if d.is_dir() for f in d.rglob("*") if f.is_file())


def compaction_soak(ctx: Context) -> None:
    """A compacted topic written for `--soak-minutes` (60; --quick 3) with a steady key set: its bytes in the object
    store must stay bounded. One `serve` (2 shards, local store) with a janitor that sweeps every 10 s and deletes
    replaced objects after 30 s. Target: the peak of the topic's stored bytes over the second half stays within
    1.1x the peak over the first (a plateau), while what was written grows linearly. Halves, not quarters: the
    stored bytes rise and fall in cycles of about 30 minutes (an hour's run of 2026-11-30: quarter means 142.6,
    133.4, 144.6, 134.7 MiB), so a quarter may hold a crest where the one it is compared with held a trough; the
    least-squares trend of the whole run goes in `extra` beside it."""
    import threading

    minutes = 3.0 if ctx.quick else float(ctx.options.get("soak_minutes") or 60)
    topic = "compaction-soak"
    args = ["--log-cleaner-backoff-ms", "5000", "--janitor-interval-s", "10", "--orphan-grace-s", "30"]
    samples: list[tuple[float, int]] = []
    with broker(ctx, "local", "compaction-soak", shards=2, extra_args=args) as b:
        made = run_worker("create_topics", {"bootstrap": b.bootstrap, "topics": [(topic, 1)], "batch": 1})
        if made["errors"]:
            raise RuntimeError(f"create {topic}: {made['errors']}")
        from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        change = ConfigResource("topic", topic, incremental_configs=[
            ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([change])[change].result(30)
        root = b.dir / "data"
        stop = threading.Event()
        t0 = time.monotonic()

        def sample() -> None:
            while not stop.wait(SOAK_SAMPLE_S):
                samples.append((time.monotonic() - t0, _topic_bytes(root, topic)))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        written = run_worker("produce_keyed", {"bootstrap": b.bootstrap, "topic": topic, "keys": SOAK_KEYS,
                                               "versions": int(SOAK_RATE * minutes * 60 / SOAK_KEYS),
                                               "value_bytes": 1024, "rate": SOAK_RATE},
                             timeout=minutes * 60 + 600)
        stop.set()
        sampler.join()
    if written["errors"] or written["undelivered"]:
        raise RuntimeError(f"soak writes: {written}")
    half = len(samples) // 2
    first = max(v for _, v in samples[:half]) if half else None
    second = max(v for _, v in samples[half:]) if half else None
    total = written["records"] * 1024 / 2**20
    trend = _trend_mib_per_min(samples)
    quarters = [round(sum(v for _, v in part) / len(part) / 2**20, 1)
                for i in range(4) if (part := samples[i * len(samples) // 4:(i + 1) * len(samples) // 4])]
    log(f"  {written['records']:,} records ({total:,.0f} MiB) over {minutes:.0f} min; topic bytes, first half peak"
        f" {first and first / 2**20:.1f} MiB, second half peak {second and second / 2**20:.1f} MiB; quarter means"
        f" {quarters} MiB; trend {trend:+.3f} MiB/min against {total / minutes:.1f} MiB/min written")
    ctx.add(Result("compaction", "soak_stored_second_over_first_half", second / first if first else None, "x",
                   "local", [Reference("target", 1.1, "x", "lower", "a plateau: the second half's peak within"
                                       " 1.1x the first's")],
                   {"minutes": minutes, "keys": SOAK_KEYS, "rate": SOAK_RATE, "record_bytes": 1024},
                   {"samples": samples, "written_mib": total, "quarter_means_mib": quarters,
                    "trend_mib_per_min": trend}))


def _trend_mib_per_min(samples: list[tuple[float, int]]) -> float:
    """The least-squares slope of the stored bytes over the run, in MiB a minute (0 when flat)."""
    if len(samples) < 2:
        return 0.0
    xs, ys = [t / 60 for t, _ in samples], [v / 2**20 for _, v in samples]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / spread if spread else 0.0
