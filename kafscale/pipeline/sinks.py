"""Table sinks of the processor, each committing its data and the Kafka offsets it covers in one atomic step.

Exactly once rests on that: a sink knows, from the table itself, the next offset of every partition it
has committed, and drops any row below it before writing. A micro-batch that Spark replays after a
crash (its offsets were logged, its commit was not) therefore adds nothing twice, and a lost
checkpoint costs a re-read, not duplicates.

- Iceberg (pyiceberg): the offsets are a table property set in the same transaction as the append,
  so they are part of the snapshot.
- Parquet (a directory, partitioned topic=…/date=…): files are written to a staging directory, then a
  manifest naming them and holding the offsets is written atomically (the commit point), then the files
  are moved into place. A crash after the manifest is rolled forward at the next start; a crash before
  it leaves only staging files, which are removed.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kafscale.pipeline.config import PipelineConfig, TableConfig

__all__ = ["IcebergSink", "ParquetSink", "Progress", "TableSink", "make_sink", "progress_of"]

Progress = dict[tuple[str, int], int]  # (topic, partition) -> next offset not yet in the table


def _encode(progress: Progress) -> str:
    out: dict[str, dict[str, int]] = {}
    for (topic, p), offset in sorted(progress.items()):
        out.setdefault(topic, {})[str(p)] = offset
    return json.dumps(out, sort_keys=True)


def _decode(text: str | None) -> Progress:
    if not text:
        return {}
    return {(t, int(p)): int(o) for t, parts in json.loads(text).items() for p, o in parts.items()}


def progress_of(table: pa.Table, before: Progress) -> Progress:
    """`before` advanced past every row of `table`."""
    after = dict(before)
    if table.num_rows:
        grouped = table.group_by(["topic", "partition"]).aggregate([("offset", "max")])
        for topic, p, last in zip(*(grouped.column(c).to_pylist() for c in ("topic", "partition", "offset_max")),
                                  strict=True):
            after[(topic, p)] = max(after.get((topic, p), 0), last + 1)
    return after


class TableSink(Protocol):
    def committed(self) -> Progress: ...

    def recover(self) -> None: ...

    def commit(self, table: pa.Table, progress: Progress) -> None: ...


class ParquetSink:
    def __init__(self, pipeline: str, table: TableConfig) -> None:
        self.root = Path(table.path)
        # Directories starting with "_" are invisible to Spark's and Arrow's dataset readers.
        self.meta = self.root / "_kafscale" / pipeline
        self.staging = self.meta / "staging"
        self.pipeline = pipeline

    def _manifests(self) -> list[Path]:
        return sorted(self.meta.glob("txn-*.json")) if self.meta.exists() else []

    def committed(self) -> Progress:
        manifests = self._manifests()
        return _decode(json.loads(manifests[-1].read_text())["offsets"]) if manifests else {}

    def recover(self) -> None:
        done = set()
        for manifest in self._manifests():
            entry = json.loads(manifest.read_text())
            self._install(entry)
            done.add(entry["txn"])
        if self.staging.exists():
            for leftover in self.staging.iterdir():
                if int(leftover.name) not in done:  # written, never committed: roll back
                    shutil.rmtree(leftover, ignore_errors=True)

    def _install(self, entry: dict) -> None:
        staged = self.staging / f"{entry['txn']:08d}"
        for rel in entry["files"]:
            source, target = staged / rel, self.root / rel
            if source.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(source, target)
        shutil.rmtree(staged, ignore_errors=True)

    def commit(self, table: pa.Table, progress: Progress) -> None:
        manifests = self._manifests()
        txn = int(manifests[-1].stem.split("-")[1]) + 1 if manifests else 1
        staged = self.staging / f"{txn:08d}"
        shutil.rmtree(staged, ignore_errors=True)
        staged.mkdir(parents=True)
        files: list[str] = []
        if table.num_rows:
            dated = table.append_column("date", pc.cast(table.column("timestamp"), pa.date32()))
            pq.write_to_dataset(dated, staged, partition_cols=["topic", "date"],
                                basename_template=f"{self.pipeline}-{txn:08d}-{{i}}.parquet",
                                file_visitor=lambda written: files.append(os.path.relpath(written.path, staged)))
        entry = {"txn": txn, "offsets": _encode(progress), "files": sorted(files),
                 "committed_ms": int(time.time() * 1000)}
        tmp = self.meta / f".txn-{txn:08d}.json"
        tmp.write_text(json.dumps(entry))
        os.replace(tmp, self.meta / f"txn-{txn:08d}.json")  # the commit point
        self._install(entry)


class IcebergSink:
    def __init__(self, pipeline: str, table: TableConfig, catalog: dict[str, str]) -> None:
        from pyiceberg.catalog import load_catalog

        self.config = table
        properties = {k: v for k, v in catalog.items() if k != "name"}
        self.catalog = load_catalog(catalog.get("name", "kafscale"), **properties)
        self.identifier = table.table
        self.property = f"kafscale.offsets.{pipeline}"

    def _table(self) -> Any:  # a pyiceberg Table, or None when it does not exist yet
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog.load_table(self.identifier)
        except NoSuchTableError:
            return None

    def committed(self) -> Progress:
        table = self._table()
        return _decode(table.properties.get(self.property)) if table is not None else {}

    def recover(self) -> None:
        pass  # a transaction either committed (offsets included) or left no trace

    def _create(self, schema: pa.Schema) -> Any:
        namespace = self.identifier.rsplit(".", 1)[0]
        self.catalog.create_namespace_if_not_exists(namespace)
        table = self.catalog.create_table_if_not_exists(self.identifier, schema=schema)
        if table.spec().is_unpartitioned():
            # Identity only: pyiceberg needs its optional Rust core (pyiceberg-core) to write day() partitions.
            with table.update_spec() as spec:
                spec.add_identity("topic")
        return table

    def commit(self, data: pa.Table, progress: Progress) -> None:
        from pyiceberg.exceptions import CommitFailedException

        for attempt in range(5):
            table = self._table() or self._create(data.schema)
            try:
                with table.transaction() as tx:
                    if data.num_rows:
                        # New fields in the declared schema become new optional columns.
                        with tx.update_schema() as update:
                            update.union_by_name(data.schema)
                        tx.append(data)
                    tx.set_properties({self.property: _encode(progress)})
                return
            except CommitFailedException:
                if attempt == 4:
                    raise
                time.sleep(0.1 * (attempt + 1))


def make_sink(cfg: PipelineConfig, table: TableConfig) -> TableSink:
    if table.format == "iceberg":
        return IcebergSink(cfg.name, table, cfg.catalog)
    return ParquetSink(cfg.name, table)
