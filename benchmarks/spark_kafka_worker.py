"""The Spark side of the `spark_kafka` scenario (benchmarks/spark_kafka.py), as a worker process of its own.

A process of its own because Spark's Kafka source must be on `spark.jars` when the process's JVM starts: the
harness may already have had a Spark JVM, and a second session in it could not load the jars. One local session
reads each source in turn, so all of them run on the same JVM, with the same cores and settings.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any

from benchmarks.common import broker_pids, process_cpu_seconds


def _cpu_by_pid(pids: list[int]) -> dict[int, float]:
    out = {}
    for pid in pids:
        with contextlib.suppress(OSError):  # a process that ended since the list was taken
            out[pid] = process_cpu_seconds(pid)
    return out


def _cpu_since(before: dict[int, float], pids: list[int]) -> float:
    """CPU seconds the processes spent since `before`; one started since then counts from zero."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in _cpu_by_pid(pids).items())


def _query(spark: Any, source: dict[str, Any], records: int) -> int:
    """One read of the whole topic; returns the sum of the values' lengths."""
    # A new DataFrame each time: re-collecting one could reuse what an earlier run computed.
    df = spark.read.format(source["format"]).options(**source["options"]).load()
    row = df.selectExpr("count(*) AS n", "sum(length(value)) AS b").collect()[0]
    if row.n != records:
        raise RuntimeError(f"{source['name']}: {row.n} rows, expected {records}")
    return int(row.b)


def spark_reads(p: dict[str, Any]) -> dict[str, Any]:
    """Params: cores, runs, records, jars (spark.jars), sources: [{name, format, options, broker_pid}].

    Per source: a warm-up query, then `runs` timed ones; each counts the rows and sums length(value), so that
    every record is fetched, decoded and handed to Spark (a bare count could be answered from offsets alone).
    Reports the best run, with the CPU seconds of the Spark processes (the driver JVM and its Python workers)
    and of the broker (the serve process tree or the Kafka JVM) over that run."""
    from kafscale.pipeline.session import spark_session

    cores = int(p["cores"])
    spark = spark_session("kafscale-bench-spark-kafka", f"local[{cores}]", {
        "spark.jars": p["jars"], "spark.driver.memory": "1g", "spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    jvm_pid = spark.sparkContext._gateway.proc.pid
    runs: dict[str, list[dict[str, float]]] = {source["name"]: [] for source in p["sources"]}
    value_bytes: dict[str, int] = {}
    try:
        # A warm-up round (Python workers start, classes load, consumers connect), then the timed rounds, each
        # source in turn: the JVM's JIT warms up over the first queries, and one source timed before another's
        # first run would pay for the code they share (a first order, Kafscale's read first, measured it ~2x slower).
        for source in p["sources"]:
            value_bytes[source["name"]] = _query(spark, source, p["records"])
        for _ in range(int(p["runs"])):
            for source in p["sources"]:
                spark0 = _cpu_by_pid([os.getpid(), *broker_pids(jvm_pid)])  # the JVM and its Python workers
                broker0 = _cpu_by_pid(broker_pids(source["broker_pid"]))
                t0 = time.perf_counter()
                _query(spark, source, p["records"])
                seconds = time.perf_counter() - t0
                runs[source["name"]].append({
                    "seconds": seconds, "spark_cpu_s": _cpu_since(spark0, [os.getpid(), *broker_pids(jvm_pid)]),
                    "broker_cpu_s": _cpu_since(broker0, broker_pids(source["broker_pid"]))})
                print(f"[spark_kafka] {source['name']}: {runs[source['name']][-1]}", file=sys.stderr, flush=True)
    finally:
        spark.stop()
    out: dict[str, Any] = {}
    for name, timed in runs.items():
        best = min(timed, key=lambda r: r["seconds"])
        out[name] = {**best, "rows_per_s": p["records"] / best["seconds"], "value_bytes": value_bytes[name],
                     "runs_s": [round(r["seconds"], 3) for r in timed]}
    return out
