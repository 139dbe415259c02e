"""`kafscale pipeline run CONFIG.yaml`: one Spark streaming query per table, appending micro-batches exactly once.

Each micro-batch is shaped on the executors (JSON parsed by the declared schema), rows the table already
holds are dropped by their offsets, and the rest is collected to the driver as Arrow and committed by the
sink together with the offsets (see sinks.py). Micro-batches are therefore bounded by
max_offsets_per_trigger: they pass through the driver's memory.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kafscale.pipeline.config import PipelineConfig, TableConfig
from kafscale.pipeline.sinks import Progress, TableSink, make_sink, progress_of

log = logging.getLogger(__name__)

__all__ = ["BatchWriter", "run_pipeline", "start_queries"]


def shape(df: Any, table: TableConfig) -> Any:
    """Kafka rows → table rows: Kafka's own columns, or the value's JSON fields plus the Kafka coordinates."""
    from pyspark.sql import functions as F

    if table.columns == "raw":
        return df.select(*[c for c in ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType",
                                       "headers") if c in df.columns])
    parsed = F.from_json(F.col("value").cast("string"), table.schema_ddl(), {"mode": "PERMISSIVE"})
    return df.select(parsed.alias("_v"), "topic", "partition", "offset", "timestamp").select(
        *[F.col(f"_v.`{name}`").alias(name) for name in table.schema], "topic", "partition", "offset", "timestamp")


def unseen(df: Any, progress: Progress) -> Any:
    """Rows at or past the table's committed offset of their partition."""
    if not progress:
        return df
    from pyspark.sql import functions as F

    pairs = [item for (t, p), o in progress.items() for item in (F.lit(f"{t}:{p}"), F.lit(o))]
    floor = F.element_at(F.create_map(*pairs), F.concat_ws(":", F.col("topic"), F.col("partition").cast("string")))
    return df.where(F.col("offset") >= F.coalesce(floor, F.lit(0)))


@dataclass
class BatchWriter:
    """The foreachBatch function of one table. `after_commit` lets tests stop the world at the worst moment:
    the table has the batch, Spark's checkpoint does not know yet."""

    table: TableConfig
    sink: TableSink
    rows_written: int = 0
    batches: int = 0
    after_commit: Callable[[int], None] | None = field(default=None, repr=False)

    def __call__(self, df: Any, batch_id: int) -> None:
        before = self.sink.committed()
        data = unseen(shape(df, self.table), before).toArrow()
        after = progress_of(data, before)
        if after != before:
            self.sink.commit(data, after)
            self.rows_written += data.num_rows
        self.batches += 1
        log.info("table %s: batch %d wrote %d rows", self.table.name, batch_id, data.num_rows)
        if self.after_commit is not None:
            self.after_commit(batch_id)


def _starting(cfg: PipelineConfig, checkpoint: str, sink: TableSink) -> str:
    """Where a query starts when its checkpoint is new: after what the table already holds."""
    if os.path.exists(os.path.join(checkpoint, "offsets")):
        return cfg.starting_offsets  # Spark resumes from the checkpoint and ignores this
    committed = sink.committed()
    if not committed:
        return cfg.starting_offsets
    out: dict[str, dict[str, int]] = {}
    for (topic, p), offset in committed.items():
        out.setdefault(topic, {})[str(p)] = offset
    return json.dumps(out)


def start_queries(spark: Any, cfg: PipelineConfig, *, trigger: str | None = None,
                  after_commit: Callable[[int], None] | None = None) -> list[tuple[Any, BatchWriter]]:
    queries = []
    for table in cfg.tables:
        sink = make_sink(cfg, table)
        sink.recover()
        checkpoint = os.path.join(cfg.checkpoint, table.name)
        reader = spark.readStream.format("kafscale").options(**cfg.source)
        if table.topics:
            reader = reader.option("topics", ",".join(table.topics))
        else:
            reader = reader.option("topicPattern", table.topic_pattern)
        reader = reader.option("startingOffsets", _starting(cfg, checkpoint, sink))
        if cfg.max_offsets_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(cfg.max_offsets_per_trigger))
        writer = BatchWriter(table, sink, after_commit=after_commit)
        stream = (reader.load().writeStream.foreachBatch(writer).queryName(f"{cfg.name}.{table.name}")
                  .option("checkpointLocation", checkpoint))
        chosen = (trigger or cfg.trigger).strip().lower()
        if chosen in ("available-now", "availablenow"):
            stream = stream.trigger(availableNow=True)
        elif chosen == "once":
            stream = stream.trigger(once=True)
        else:
            stream = stream.trigger(processingTime=chosen)
        queries.append((stream.start(), writer))
    return queries


def run_pipeline(spark: Any, cfg: PipelineConfig, *, trigger: str | None = None) -> dict[str, int]:
    """Run until every query ends (available-now) or one fails or is interrupted; rows written per table."""
    spark.streams.resetTerminated()  # forget queries that ended before this run
    queries = start_queries(spark, cfg, trigger=trigger)
    try:
        # Any query's failure ends the run (awaitAnyTermination raises it), not only the first one's.
        while any(query.isActive for query, _ in queries):
            spark.streams.awaitAnyTermination()
            spark.streams.resetTerminated()
        for query, _ in queries:
            if query.exception() is not None:
                raise RuntimeError(f"query {query.name} failed: {query.exception()}")
    finally:
        for query, _ in queries:
            if query.isActive:
                query.stop()
    return {writer.table.name: writer.rows_written for _, writer in queries}
