"""The `compaction` scenario (issue 34): what one cleaning pass costs, on a keyed log.

A log of `keys` distinct keys with 10 values each, in random order (1 M keys, 10 M records of 100-byte values; 100 k
keys with --quick), written straight into a local object directory; then one pass over it, with the broker's own
code, in a process of its own (benchmarks/compaction_worker.py). Reported:

* cleaning throughput, MiB of log per CPU-second (one pass runs on one core), beside the store's raw GET rate;
* the pass's peak memory over its process's baseline, against the bound it is built to keep: the key map
  (`ENTRY_BYTES` per key) and four segments' worth of bytes (the segment being read, the kept batches of the group
  being written, the new segment object assembled from them, and its index and write buffer);
* the reclaimed fraction of the log's bytes (with 10 values per key, at most 0.9 is there to reclaim).
"""

from __future__ import annotations

import shutil
from typing import Any

from benchmarks.common import Context, Reference, Result, log, run_worker

VERSIONS = 10
SEGMENT_MIB = 4
MAP_ENTRIES = 1_000_000  # the broker's default --compaction-map-entries


def compaction(ctx: Context) -> None:
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
