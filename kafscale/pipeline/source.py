"""The `kafscale` Spark data source: batch and streaming reads of committed segments, and a producing writer.

    spark.read.format("kafscale").option("topic", "orders").option("kafscale.data.dir", "./data").load()

Columns are those of Spark's own Kafka source. Planning (which segments, which offsets) runs on the
driver from the metadata store; each input partition is one segment or a byte range of one, fetched
and decoded by an executor into an Arrow batch.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceWriter,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kafscale.pipeline.planning import (
    Offsets,
    SourceOptions,
    group_slices,
    include_headers,
    plan_slices,
    resolve_offsets,
    starting_offsets,
)
from kafscale.pipeline.slices import read_slice

__all__ = ["KAFKA_SCHEMA", "KAFKA_SCHEMA_WITHOUT_HEADERS", "KafscaleDataSource"]

KAFKA_SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
    StructField("headers", ArrayType(StructType([StructField("key", StringType()),
                                                 StructField("value", BinaryType())]))),
])

KAFKA_SCHEMA_WITHOUT_HEADERS = StructType(KAFKA_SCHEMA.fields[:-1])


class KafscaleDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "kafscale"

    def schema(self) -> StructType:
        return KAFKA_SCHEMA if include_headers(self.options) else KAFKA_SCHEMA_WITHOUT_HEADERS

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafscaleBatchReader(SourceOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafscaleStreamReader(SourceOptions.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from kafscale.pipeline.writer import KafscaleWriter  # confluent-kafka only where rows are produced

        return KafscaleWriter(dict(self.options), schema, overwrite)


def _ms(value: Any, *, ceil: bool) -> int | None:
    if not isinstance(value, datetime.datetime):
        return None
    # Spark hands timestamps over as naive local-time datetimes (or aware ones); .timestamp() reads both.
    micros = round(value.timestamp() * 1_000_000)
    return -(-micros // 1000) if ceil else micros // 1000


class _Bounds:
    """What pushed-down filters tell about the rows wanted; used only to skip segments, never to drop rows
    (every filter is still evaluated by Spark)."""

    def __init__(self) -> None:
        self.min_ts: int | None = None
        self.max_ts: int | None = None
        self.topics: set[str] | None = None
        self.partitions: set[int] | None = None
        self.min_offset: int | None = None
        self.max_offset: int | None = None

    def push(self, f: Filter) -> None:
        column = f.attribute[0] if len(f.attribute) == 1 else None  # type: ignore[attr-defined]
        value = getattr(f, "value", None)
        if column == "timestamp":
            if isinstance(f, GreaterThan | GreaterThanOrEqual | EqualTo) and (ms := _ms(value, ceil=False)) is not None:
                self.min_ts = ms if self.min_ts is None else max(self.min_ts, ms)
            if isinstance(f, LessThan | LessThanOrEqual | EqualTo) and (ms := _ms(value, ceil=True)) is not None:
                self.max_ts = ms if self.max_ts is None else min(self.max_ts, ms)
        elif column in ("topic", "partition") and isinstance(f, EqualTo | In):
            values = set(value) if isinstance(f, In) else {value}
            current = getattr(self, column + "s")
            setattr(self, column + "s", values if current is None else current & values)
        elif column == "offset" and isinstance(value, int):
            if isinstance(f, GreaterThan | GreaterThanOrEqual | EqualTo):
                low = value + 1 if isinstance(f, GreaterThan) else value
                self.min_offset = low if self.min_offset is None else max(self.min_offset, low)
            if isinstance(f, LessThan | LessThanOrEqual | EqualTo):
                high = value if isinstance(f, LessThan) else value + 1
                self.max_offset = high if self.max_offset is None else min(self.max_offset, high)

    def narrow(self, start: dict[tuple[str, int], int], end: dict[tuple[str, int], int]) -> None:
        for tp in list(end):
            if (self.topics is not None and tp[0] not in self.topics) or (
                    self.partitions is not None and tp[1] not in self.partitions):
                end[tp] = start[tp]
                continue
            if self.min_offset is not None:
                start[tp] = max(start[tp], self.min_offset)
            if self.max_offset is not None:
                end[tp] = min(end[tp], self.max_offset)


class KafscaleBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.bounds = _Bounds()

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        for f in filters:
            self.bounds.push(f)
            yield f  # pruning is by segment, so Spark must still apply every filter to the rows

    def partitions(self) -> Sequence[InputPartition]:
        snap = self.opts.snapshot()
        start = starting_offsets(self.opts, snap)
        end = resolve_offsets(self.opts, snap, self.opts.ending, ending=True)
        self.bounds.narrow(start, end)
        slices = plan_slices(self.opts, snap, start, end, min_timestamp=self.bounds.min_ts,
                             max_timestamp=self.bounds.max_ts)
        return [InputPartition(group) for group in group_slices(self.opts, slices)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_group(partition, self.opts.include_headers)


def read_group(partition: InputPartition, headers: bool) -> Iterator[pa.RecordBatch]:
    # Spark plans one partition without a value when partitions() returned none.
    for piece in partition.value or ():
        for batch in read_slice(piece):
            yield batch if headers else batch.drop_columns(["headers"])


def _to_json(offsets: dict[tuple[str, int], int]) -> Offsets:
    out: Offsets = {}
    for (topic, p), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(p)] = offset
    return out


def _from_json(offsets: Offsets) -> dict[tuple[str, int], int]:
    return {(topic, int(p)): int(o) for topic, parts in offsets.items() for p, o in parts.items()}


def _rate_limit(start: dict[tuple[str, int], int], end: dict[tuple[str, int], int], limit: int) -> None:
    """At most `limit` records in total, shared in proportion to what each partition has waiting
    (maxOffsetsPerTrigger as Spark's Kafka source applies it)."""
    waiting = {tp: end[tp] - start.get(tp, end[tp]) for tp in end}
    total = sum(waiting.values())
    if total <= limit:
        return
    grant = {tp: n * limit // total for tp, n in waiting.items()}
    spare = limit - sum(grant.values())
    for tp in sorted(waiting, key=lambda t: waiting[t] - grant[t], reverse=True)[:spare]:
        grant[tp] += 1
    for tp, n in grant.items():
        end[tp] = start.get(tp, end[tp]) + n


class KafscaleStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are Spark's Kafka JSON, {"topic": {"partition": next offset}}, so the checkpoint shows them.
    Under read_committed they advance only to each partition's last stable offset."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._target: dict[tuple[str, int], int] | None = None

    def initialOffset(self) -> dict:
        snap = self.opts.snapshot()
        return _to_json(starting_offsets(self.opts, snap))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        snap = self.opts.snapshot()
        self._target = {tp: self.opts.visible_end(log) for tp, log in snap.logs.items()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        snap = self.opts.snapshot()
        begin = _from_json(start)
        # Under read_committed a micro-batch ends at the last stable offset: an open transaction's records are
        # read by a later micro-batch, once it has committed (or skipped, once it has aborted).
        end = {tp: self.opts.visible_end(log) for tp, log in snap.logs.items()}
        for tp, log in snap.logs.items():
            if tp not in begin:  # a partition or topic that appeared since: read it from its start
                begin[tp] = log.log_start
        if self._target is not None:
            end = {tp: min(o, self._target.get(tp, begin[tp])) for tp, o in end.items()}
        end = {tp: max(o, begin[tp]) for tp, o in end.items()}
        if isinstance(limit, ReadMaxRows):
            _rate_limit(begin, end, limit.max_rows)
        return _to_json(end)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        snap = self.opts.snapshot()
        begin, stop = _from_json(start), _from_json(end)
        stop = {tp: o for tp, o in stop.items() if tp in snap.logs}
        slices = plan_slices(self.opts, snap, {tp: begin.get(tp, snap.logs[tp].log_start) for tp in stop}, stop)
        return [InputPartition(group) for group in group_slices(self.opts, slices)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_group(partition, self.opts.include_headers)

    def commit(self, end: dict) -> None:
        pass  # nothing to release: segments stay in the store whatever the query has read
