"""The `spark_kafka` scenario (issue 36): Spark rows per second per core of Kafscale's segment source, beside Spark's
own Kafka source reading the same topic from Kafscale, and from Apache Kafka.

One topic (4 partitions, 100-byte values, no key, no compression: Kafka's ProducerPerformance with acks=all) is
written to `kafscale serve` on the local store and to Apache Kafka 4.4.0. Then one local Spark session
(local[2], as pipeline_read) reads it:
* `format("kafscale")`: the segments straight from the broker's data directory (the broker is not asked);
* `format("kafka")` (spark-sql-kafka-0-10, its Java consumer) from Kafscale over TCP, and from Apache Kafka; each
  twice: with the consumer's defaults, as a user gets it, and with fetch.max.wait.ms=10. Each Spark task ends only
  once a fetch at its partition's end has come back, and a broker holds that one for fetch.max.wait.ms (500 ms by
  default; Apache Kafka as Kafscale): a fixed tail per task, which the second setting takes out of the throughput.
Each read counts the rows and sums length(value), so every record is fetched and decoded. After a warm-up round,
the sources take turns, and each one's best run counts. Rows/s per core is rows/s over the session's cores; beside
it, the CPU seconds the Spark processes and the broker spent on that run. Apache Kafka's figure (same consumer
settings) is each Kafscale figure's reference, and the pipeline's target (1 M records/s per core, pipeline_read)
the segment source's.

Not in the default run (it needs the reference Kafka and Spark's Kafka source: `make bench` fetches both):
`make bench BENCH_ARGS="--scenario spark_kafka --backend local"`. `--quick`: 1,000,000 records, 2 runs a source.
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
FULL_RECORDS, QUICK_RECORDS = 4_000_000, 1_000_000
FULL_RUNS, QUICK_RUNS = 3, 2
PIPELINE_TARGET_PER_CORE = 1_000_000  # benchmarks/pipeline_read.py's target for the segment source
# The same producer for both brokers: large batches so that writing the topic takes seconds, not minutes.
PRODUCER_PROPS = ("acks=all", "batch.size=262144", "linger.ms=20", "compression.type=none")
# Spark's Kafka source with its consumer's defaults, and without the 500 ms end-of-partition fetch wait.
CONSUMER_SETTINGS: dict[str, dict[str, str]] = {"": {}, "_wait10ms": {"kafka.fetch.max.wait.ms": "10"}}


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
        brokers = {"kafscale": (b.bootstrap, b.serve.proc.pid), "apache_kafka": (kafka.bootstrap, kafka.pid)}
        sources: list[dict[str, Any]] = [
            {"name": "segment_source", "format": "kafscale", "broker_pid": b.serve.proc.pid,
             "options": {"topic": topic, "kafscale.data.dir": str(b.serve.data_dir)}}]
        for suffix, consumer in CONSUMER_SETTINGS.items():
            for side, (bootstrap, pid) in brokers.items():
                sources.append({"name": f"kafka_source_{side}{suffix}", "format": "kafka", "broker_pid": pid,
                                "options": {**kafka_options, **consumer, "kafka.bootstrap.servers": bootstrap}})
        got = run_worker("spark_reads", {"cores": SPARK_CORES, "runs": runs, "records": records, "jars": jars,
                                         "sources": sources}, timeout=3600)
    settings: dict[str, Any] = {
        "records": records, "record_bytes": RECORD_BYTES, "partitions": PARTITIONS, "spark_master":
        f"local[{SPARK_CORES}]", "runs": runs, "query": "count(*), sum(length(value)); best run after a warm-up",
        "producer": ["ProducerPerformance", *PRODUCER_PROPS], "kafscale_segments": segments,
        "write_s": {k: round(v, 1) for k, v in write_s.items()}, "spark_kafka_source": SPARK_KAFKA_VERSION,
        "apache_kafka": LATEST, "kafscale": b.settings,
        "consumer_settings": CONSUMER_SETTINGS, "note": "both brokers run during every read",
    }
    _add(ctx, got, settings)


def _per_core(figures: dict[str, Any]) -> float:
    return float(figures["rows_per_s"]) / SPARK_CORES


def _add(ctx: Context, got: dict[str, dict[str, Any]], settings: dict[str, Any]) -> None:
    def reference(name: str, what: str, per_core: bool = True) -> Reference:
        value = _per_core(got[name]) if per_core else got[name]["rows_per_s"]
        return Reference("limit", round(value), "rows/s per core" if per_core else "rows/s", "higher", what)

    target = Reference("target", PIPELINE_TARGET_PER_CORE, "rows/s per core", "higher",
                       "the segment source's target (benchmarks/pipeline_read.py, 100-byte records)")
    references: dict[str, tuple[list[Reference], list[Reference], str]] = {}
    for suffix, consumer in CONSUMER_SETTINGS.items():
        how = f" ({', '.join(f'{k}={v}' for k, v in consumer.items()) or 'consumer defaults'})"
        theirs = f"Spark's Kafka source reading the same topic from Apache Kafka {LATEST}{how}, same session"
        kafka = f"kafka_source_apache_kafka{suffix}"
        references[f"kafka_source_kafscale{suffix}"] = (
            [reference(kafka, theirs)], [reference(kafka, theirs, per_core=False)], "local")
        references[kafka] = ([], [], "kafka")
    kafka, ours = "kafka_source_apache_kafka", "kafka_source_kafscale"
    references["segment_source"] = (
        [target, reference(kafka, f"Spark's Kafka source from Apache Kafka {LATEST} (consumer defaults), same session"),
         reference(ours, "Spark's Kafka source from Kafscale over TCP (consumer defaults), same session"),
         reference(f"{kafka}_wait10ms", f"Spark's Kafka source from Apache Kafka {LATEST} (fetch.max.wait.ms=10)")],
        [reference(kafka, "Spark's Kafka source from Apache Kafka (consumer defaults)", per_core=False)], "local")
    for name, (per_core_refs, total_refs, backend) in references.items():
        figures = got[name]
        extra = {"seconds": round(figures["seconds"], 3), "runs_s": figures["runs_s"],
                 "spark_cpu_s": round(figures["spark_cpu_s"], 2), "broker_cpu_s": round(figures["broker_cpu_s"], 2),
                 "rows_per_spark_cpu_s": round(settings["records"] / max(figures["spark_cpu_s"], 1e-9)),
                 "value_bytes": figures["value_bytes"]}
        ctx.add(Result("spark_kafka", f"{name}_rows_s_per_core", round(_per_core(figures)), "rows/s per core",
                       backend, per_core_refs, settings, extra))
        ctx.add(Result("spark_kafka", f"{name}_rows_s", round(figures["rows_per_s"]), "rows/s", backend, total_refs,
                       {"records": settings["records"]}))
