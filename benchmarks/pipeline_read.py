"""Pipeline read throughput: segments → Arrow, on its own and through Spark. `python -m benchmarks.pipeline_read`.

Target: ≥ 1 M records/s per core for 100-byte uncompressed records. The limit measured in the same run is
how fast the object store hands the same segment bytes over (whole-object GETs, converted to records/s):
the reader cannot beat it. Prints one JSON document on stdout; progress goes to stderr.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from kafscale.cluster import keys
from kafscale.cluster.records import SegmentMeta
from kafscale.pipeline.records import decode_batches
from kafscale.storage import keys as object_keys
from kafscale.storage.batch import set_base_offset
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.local_store import LocalDirStore
from kafscale.storage.segment import SegmentReader, build_segment

TARGET_PER_CORE = 1_000_000
VALUE_BYTES = 100
RECORDS_PER_BATCH = 1000
RECORDS_PER_SEGMENT = 40_000  # ~4.4 MiB: the broker's default 4 MiB segments
SEGMENTS = int(os.environ.get("KAFSCALE_BENCH_SEGMENTS", "25"))  # 1 M records
SPARK_CORES = 2
TOPIC = "bench"


def log(msg: str) -> None:
    print(f"[pipeline_read {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def make_segments() -> list[tuple[SegmentMeta, bytes, bytes]]:
    value = os.urandom(VALUE_BYTES)
    template = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 30)
    for i in range(RECORDS_PER_BATCH):
        template.append(i, 1_700_000_000_000 + i, None, value, [])
    batch = bytes(template.build())
    out = []
    offset = 0
    for _ in range(SEGMENTS):
        chunks = []
        for _ in range(RECORDS_PER_SEGMENT // RECORDS_PER_BATCH):
            buf = bytearray(batch)
            set_base_offset(buf, 0, offset)
            offset += RECORDS_PER_BATCH
            chunks.append(bytes(buf))
        built = build_segment(chunks, created_ms=int(time.time() * 1000))
        out.append((SegmentMeta.from_info(built.info), built.data, built.index))
    return out


def best_of(runs: int, fn: Any) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure_core(segments: list[tuple[SegmentMeta, bytes, bytes]]) -> dict[str, float]:
    """One core, no Spark: the full check (every CRC) plus the decode, and the decode alone."""
    readers = [SegmentReader(data, verify=False) for _, data, _ in segments]
    records = sum(meta.records for meta, _, _ in segments)

    def decode_only() -> None:
        for reader in readers:
            decode_batches([(reader.batch_bytes(p, h), h) for p, h in reader.batches()], TOPIC, 0)

    def checked() -> None:
        for _, data, _ in segments:
            reader = SegmentReader(data, verify=True)
            decode_batches([(reader.batch_bytes(p, h), h) for p, h in reader.batches()], TOPIC, 0)

    return {"decode_records_per_s": records / best_of(3, decode_only),
            "checked_decode_records_per_s": records / best_of(3, checked)}


def write_deployment(root: Path, segments: list[tuple[SegmentMeta, bytes, bytes]]) -> None:
    """The layout of a broker's --data-dir: objects, and the commit records the source plans from."""
    objects = LocalDirStore(root / "objects")
    for meta, data, index in segments:
        objects.put(object_keys.segment_key("default", TOPIC, 0, meta.base), data)
        objects.put(object_keys.index_key("default", TOPIC, 0, meta.base), index)

    async def commit() -> None:
        store = EmbeddedStore(root / "metadata.db")
        try:
            await store.put(keys.topic(TOPIC), {"id": "00000000-0000-0000-0000-000000000001", "partitions": 1,
                                                "placement": [0], "configs": {}, "created_ms": 0})
            for meta, _, _ in segments:
                await store.put(keys.segment(TOPIC, 0, meta.base), meta.to_value())
            await store.put(keys.state(TOPIC, 0), {"next_offset": segments[-1][0].last + 1, "log_start_offset": 0,
                                                    "epoch": 1})
        finally:
            await store.close()

    asyncio.run(commit())


def measure_store(root: Path, segments: list[tuple[SegmentMeta, bytes, bytes]]) -> float:
    objects = LocalDirStore(root / "objects")
    records = sum(meta.records for meta, _, _ in segments)
    seconds = best_of(3, lambda: [objects.get(object_keys.segment_key("default", TOPIC, 0, m.base))
                                  for m, _, _ in segments])
    return records / seconds


def _ceiling_source(segment_path: Path, segment_bytes: int) -> Any:
    """A source that hands Spark ready-made Arrow batches of the same shape, one per segment, in as many
    partitions as the kafscale source packs the segments into: what Spark itself can take in from a Python
    data source, the ceiling of any reader behind it. Each Python worker decodes one segment once and then
    yields that batch again and again (kept in sys.modules, which outlives a task in a reused worker)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from kafscale.pipeline.planning import SourceOptions
    from kafscale.pipeline.source import KAFKA_SCHEMA

    per_task = max(1, SourceOptions.max_partition_bytes // segment_bytes)
    path = str(segment_path)

    class CeilingReader(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            starts = range(0, SEGMENTS, per_task)
            return [InputPartition(min(per_task, SEGMENTS - start)) for start in starts]

        def read(self, partition: Any) -> Any:
            import types

            from kafscale.pipeline.records import decode_batches
            from kafscale.storage.segment import SegmentReader

            cache = sys.modules.setdefault("_kafscale_bench_ceiling", types.ModuleType("_kafscale_bench_ceiling"))
            if not hasattr(cache, "batch"):
                reader = SegmentReader(Path(path).read_bytes())
                cache.batch = decode_batches([(reader.batch_bytes(p, h), h) for p, h in reader.batches()], TOPIC, 0)
            for _ in range(partition.value):
                yield cache.batch

    class CeilingSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "kafscale_ceiling"

        def schema(self) -> Any:
            return KAFKA_SCHEMA

        def reader(self, schema: Any) -> Any:
            return CeilingReader()

    return CeilingSource


def measure_spark(root: Path, records: int, segment_bytes: int) -> tuple[float, float]:
    from kafscale.pipeline.session import spark_session

    spark = spark_session("kafscale-bench", f"local[{SPARK_CORES}]",
                          {"spark.driver.memory": "1g", "spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    try:
        def query() -> None:
            # A new DataFrame each time: re-collecting one would reuse its shuffle output and skip the scan.
            df = spark.read.format("kafscale").option("topic", TOPIC).option("kafscale.data.dir", str(root)).load()
            # sum(length(value)) makes every record cross from Python to the JVM.
            row = df.selectExpr("count(*) AS n", "sum(length(value)) AS b").collect()[0]
            assert row.n == records, row

        query()  # warm-up: Python workers start, classes load
        rate = records / best_of(2, query)

        first = root / "objects" / object_keys.segment_key("default", TOPIC, 0, 0)
        spark.dataSource.register(_ceiling_source(first, segment_bytes))

        def ceiling() -> None:
            df = spark.read.format("kafscale_ceiling").load()
            row = df.selectExpr("count(*) AS n", "sum(length(value))").collect()[0]
            assert row.n == records, row

        ceiling()
        return rate, records / best_of(2, ceiling)
    finally:
        spark.stop()


def main() -> int:
    log(f"building {SEGMENTS} segments of {RECORDS_PER_SEGMENT} × {VALUE_BYTES}-byte records")
    segments = make_segments()
    records = sum(meta.records for meta, _, _ in segments)
    core = measure_core(segments)
    log(f"core: {core}")
    with tempfile.TemporaryDirectory(prefix="kafscale-bench-") as tmp:
        root = Path(tmp)
        write_deployment(root, segments)
        store = measure_store(root, segments)
        log(f"store GETs: {store:,.0f} records/s")
        spark_rate, ceiling = measure_spark(root, records, len(segments[0][1]))
        log(f"spark: {spark_rate:,.0f} records/s on {SPARK_CORES} cores; Spark's own ceiling {ceiling:,.0f}")
    per_core = core["checked_decode_records_per_s"]
    result = {
        "benchmark": "pipeline_read",
        "records": records,
        "value_bytes": VALUE_BYTES,
        "codec": "none",
        "figure": {"name": "segment→Arrow records/s per core (CRC-checked)", "value": round(per_core)},
        "target": {"kind": "target", "value": TARGET_PER_CORE, "unit": "records/s per core", "better": "higher",
                   "ratio": round(per_core / TARGET_PER_CORE, 3)},
        "limit": {"kind": "limit", "what": "object store GET of the same segments", "value": round(store),
                  "unit": "records/s", "ratio": round(per_core / store, 3)},
        "core_decode_only_records_per_s": round(core["decode_records_per_s"]),
        "spark": {"cores": SPARK_CORES, "records_per_s": round(spark_rate),
                  "records_per_s_per_core": round(spark_rate / SPARK_CORES),
                  "target_ratio": round(spark_rate / SPARK_CORES / TARGET_PER_CORE, 3),
                  "limit": {"kind": "limit", "what": "Spark ingesting ready-made Arrow batches of the same shape"
                            " from a Python data source", "value": round(ceiling), "unit": "records/s",
                            "ratio": round(spark_rate / ceiling, 3)}},
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
