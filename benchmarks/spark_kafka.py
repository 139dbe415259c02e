"""The `spark_kafka` scenario (issue 36): Spark rows per second per core of Kafscale's segment source, beside Spark's
own Kafka source reading the same topic from Kafscale, and from Apache Kafka.

One topic (4 partitions, 100-byte values, no key, no compression: Kafka's ProducerPerformance with acks=all) is
written to `kafscale serve` on the local store and to Apache Kafka 4.4.0. Then one local Spark session
(local[2], as pipeline_read) reads it three ways:
* `format("kafscale")`: the segments straight from the broker's data directory (the broker is not asked);
* `format("kafka")` (spark-sql-kafka-0-10, its Java consumer) from Kafscale over TCP;
* `format("kafka")` from Apache Kafka over TCP.
Each read counts the rows and sums length(value), so every record is fetched and decoded; the best of a few runs
after a warm-up counts. Rows/s per core is rows/s over the session's cores; beside it, the CPU seconds the Spark
processes and the broker spent on that run. Apache Kafka's figure is each Kafscale figure's reference, and the
pipeline's target (1 M records/s per core, pipeline_read) the segment source's.

Not in the default run (it needs the reference Kafka and Spark's Kafka source: `make bench` fetches both):
`make bench BENCH_ARGS="--scenario spark_kafka --backend local"`. `--quick`: 400,000 records, 2 runs a source.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import Broker, Context, Reference, Result, broker, log, run_worker
from benchmarks.vs_kafka import _tool
from kafscale.testing.kafka_reference import LATEST, PRODUCTION_JVM_FLAGS, ReferenceKafka
from kafscale.testing.spark_kafka import SPARK_KAFKA_VERSION, spark_kafka_conf

RECORD_BYTES = 100
PARTITIONS = 4
SPARK_CORES = 2
FULL_RECORDS, QUICK_RECORDS = 4_000_000, 400_000
FULL_RUNS, QUICK_RUNS = 3, 2
PIPELINE_TARGET_PER_CORE = 1_000_000  # benchmarks/pipeline_read.py's target for the segment source
# The same producer for both brokers: large batches so that writing the topic takes seconds, not minutes.
PRODUCER_PROPS = ("acks=all", "batch.size=262144", "linger.ms=20", "compression.type=none")


def _write(work: Any, bootstrap: str, topic: str, records: int) -> float:
    """Create the topic and fill it; returns the seconds ProducerPerformance took."""
    _tool(work, "TopicCommand", "--bootstrap-server", bootstrap, "--create", "--topic", topic, "--partitions",
          str(PARTITIONS), "--replication-factor", "1")
    t0 = time.monotonic()
    _tool(work, "ProducerPerformance", "--topic", topic, "--num-records", str(records), "--record-size",
          str(RECORD_BYTES), "--throughput", "-1", "--producer-props", f"bootstrap.servers={bootstrap}",
          *PRODUCER_PROPS)
    return time.monotonic() - t0


def _segments(b: Broker, topic: str) -> int:
    from kafscale.pipeline.committed import read_snapshot
    from kafscale.pipeline.location import Location

    snap = read_snapshot(Location.from_options({"kafscale.data.dir": str(b.serve.data_dir)}), topics=[topic])
    return sum(len(log.segments) for log in snap.logs.values())


def spark_kafka(ctx: Context) -> None:
    records = QUICK_RECORDS if ctx.quick else FULL_RECORDS
    runs = QUICK_RUNS if ctx.quick else FULL_RUNS
    jars = spark_kafka_conf()["spark.jars"]  # before any broker starts: a missing install fails at once
    work = ctx.work / "spark-kafka"
    work.mkdir(exist_ok=True)
    topic = f"spark-read-{time.monotonic_ns() % 10**6}"
    kafka = ReferenceKafka(LATEST, parent_dir=ctx.work, jvm_flags=PRODUCTION_JVM_FLAGS)
    with kafka, broker(ctx, "local", "spark_kafka") as b:
        assert b.serve.proc is not None and kafka.pid is not None
        log(f"  writing {records:,} x {RECORD_BYTES} B records into {PARTITIONS} partitions of each broker")
        write_s = {"kafscale": _write(work, b.bootstrap, topic, records),
                   "kafka": _write(work, kafka.bootstrap, topic, records)}
        segments = _segments(b, topic)
        kafka_options = {"subscribe": topic, "startingOffsets": "earliest", "endingOffsets": "latest"}
        sources = [
            {"name": "segment_source", "format": "kafscale", "broker_pid": b.serve.proc.pid,
             "options": {"topic": topic, "kafscale.data.dir": str(b.serve.data_dir)}},
            {"name": "kafka_source_kafscale", "format": "kafka", "broker_pid": b.serve.proc.pid,
             "options": {**kafka_options, "kafka.bootstrap.servers": b.bootstrap}},
            {"name": "kafka_source_apache_kafka", "format": "kafka", "broker_pid": kafka.pid,
             "options": {**kafka_options, "kafka.bootstrap.servers": kafka.bootstrap}},
        ]
        got = run_worker("spark_reads", {"cores": SPARK_CORES, "runs": runs, "records": records, "jars": jars,
                                         "sources": sources}, timeout=3600)
    settings: dict[str, Any] = {
        "records": records, "record_bytes": RECORD_BYTES, "partitions": PARTITIONS, "spark_master":
        f"local[{SPARK_CORES}]", "runs": runs, "query": "count(*), sum(length(value)); best run after a warm-up",
        "producer": ["ProducerPerformance", *PRODUCER_PROPS], "kafscale_segments": segments,
        "write_s": {k: round(v, 1) for k, v in write_s.items()}, "spark_kafka_source": SPARK_KAFKA_VERSION,
        "apache_kafka": LATEST, "kafscale": b.settings,
        "note": "both brokers run during every read; Spark's Kafka source with its default consumer settings",
    }
    _add(ctx, got, settings)


def _per_core(figures: dict[str, Any]) -> float:
    return float(figures["rows_per_s"]) / SPARK_CORES


def _add(ctx: Context, got: dict[str, dict[str, Any]], settings: dict[str, Any]) -> None:
    kafka = got["kafka_source_apache_kafka"]
    theirs = Reference("limit", round(_per_core(kafka)), "rows/s per core", "higher",
                       f"Spark's Kafka source reading the same topic from Apache Kafka {LATEST}, same session")
    theirs_total = Reference("limit", round(kafka["rows_per_s"]), "rows/s", "higher", theirs.description)
    over_kafscale = Reference("limit", round(_per_core(got["kafka_source_kafscale"])), "rows/s per core", "higher",
                              "Spark's Kafka source reading the same topic from Kafscale over TCP, same session")
    target = Reference("target", PIPELINE_TARGET_PER_CORE, "rows/s per core", "higher",
                       "the segment source's target (benchmarks/pipeline_read.py, 100-byte records)")
    references = {"segment_source": ([target, theirs, over_kafscale], "local"),
                  "kafka_source_kafscale": ([theirs], "local"),
                  "kafka_source_apache_kafka": ([], "kafka")}
    for name, (refs, backend) in references.items():
        figures = got[name]
        extra = {"seconds": round(figures["seconds"], 3), "runs_s": figures["runs_s"],
                 "spark_cpu_s": round(figures["spark_cpu_s"], 2), "broker_cpu_s": round(figures["broker_cpu_s"], 2),
                 "rows_per_spark_cpu_s": round(settings["records"] / max(figures["spark_cpu_s"], 1e-9)),
                 "value_bytes": figures["value_bytes"]}
        ctx.add(Result("spark_kafka", f"{name}_rows_s_per_core", round(_per_core(figures)), "rows/s per core",
                       backend, refs, settings, extra))
        ctx.add(Result("spark_kafka", f"{name}_rows_s", round(figures["rows_per_s"]), "rows/s", backend,
                       [theirs_total] if refs else [], {"records": settings["records"]}))
