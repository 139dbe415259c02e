"""The table processor's YAML: which topics go to which tables, and how. docs/pipeline.md has the reference.

    name: shop
    source: {kafscale.data.dir: ./data}          # or kafscale.s3.* with kafscale.etcd.endpoints
    checkpoint: ./pipeline/checkpoints
    trigger: available-now                       # or "10 seconds"
    max_offsets_per_trigger: 100000
    catalog: {type: sql, uri: "sqlite:///pipeline/catalog.db", warehouse: "file:///…/warehouse"}
    tables:
      - name: orders
        topics: [orders]
        format: iceberg                          # or parquet (then: path)
        table: shop.orders
        columns: json                            # or raw
        schema: {id: long, customer: string, amount: double}
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["ConfigError", "PipelineConfig", "TableConfig", "load_config"]

METADATA_COLUMNS = ("topic", "partition", "offset", "timestamp", "date")
_NAME = re.compile(r"[A-Za-z0-9_.-]+")


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class TableConfig:
    name: str
    format: str  # "parquet" or "iceberg"
    topics: list[str] | None = None
    topic_pattern: str | None = None
    columns: str = "raw"  # "raw" (Kafka's columns) or "json" (value parsed by schema)
    schema: dict[str, str] = field(default_factory=dict)
    path: str = ""  # parquet: directory of the table
    table: str = ""  # iceberg: namespace.table

    def schema_ddl(self) -> str:
        return ", ".join(f"`{name}` {kind}" for name, kind in self.schema.items())


@dataclass(frozen=True)
class PipelineConfig:
    name: str
    source: dict[str, str]
    checkpoint: str
    tables: list[TableConfig]
    trigger: str = "available-now"
    max_offsets_per_trigger: int | None = None
    starting_offsets: str = "earliest"
    catalog: dict[str, str] = field(default_factory=dict)
    spark: dict[str, str] = field(default_factory=dict)


def _table(raw: Any, base: Path, index: int) -> TableConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"tables[{index}] must be a mapping")
    name = str(raw.get("name") or "")
    if not _NAME.fullmatch(name):
        raise ConfigError(f"tables[{index}]: name must be letters, digits, '_', '.' or '-', got {name!r}")
    fmt = str(raw.get("format", "parquet")).lower()
    if fmt not in ("parquet", "iceberg"):
        raise ConfigError(f"table {name}: format must be parquet or iceberg, got {fmt!r}")
    topics = raw.get("topics", raw.get("topic"))
    if isinstance(topics, str):
        topics = [topics]
    pattern = raw.get("topic_pattern")
    if bool(topics) == bool(pattern):
        raise ConfigError(f"table {name}: give exactly one of topics or topic_pattern")
    columns = str(raw.get("columns", "raw")).lower()
    if columns not in ("raw", "json"):
        raise ConfigError(f"table {name}: columns must be raw or json, got {columns!r}")
    schema = {str(k): str(v) for k, v in (raw.get("schema") or {}).items()}
    if columns == "json":
        if not schema:
            raise ConfigError(f"table {name}: columns json needs a schema (field: type)")
        clash = sorted(set(schema) & set(METADATA_COLUMNS))
        if clash:
            raise ConfigError(f"table {name}: schema fields {clash} clash with the Kafka columns {METADATA_COLUMNS}")
    path = str(raw.get("path") or "")
    if fmt == "parquet":
        if not path:
            raise ConfigError(f"table {name}: parquet tables need a path")
        path = str((base / path).resolve())
    table = str(raw.get("table") or "")
    if fmt == "iceberg" and "." not in table:
        raise ConfigError(f"table {name}: iceberg tables need table: namespace.name")
    return TableConfig(name, fmt, list(topics) if topics else None, pattern, columns, schema, path, table)


def load_config(path: str | Path) -> PipelineConfig:
    """Relative paths in the file are relative to the file's directory."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    return parse_config(raw, path.parent.resolve())


def parse_config(raw: Any, base: Path) -> PipelineConfig:
    if not isinstance(raw, dict):
        raise ConfigError("the pipeline config must be a mapping")
    name = str(raw.get("name") or "")
    if not _NAME.fullmatch(name):
        raise ConfigError(f"name must be letters, digits, '_', '.' or '-', got {name!r}")
    source = {str(k): str(v) for k, v in (raw.get("source") or {}).items()}
    if "kafscale.data.dir" in source:
        source["kafscale.data.dir"] = str((base / source["kafscale.data.dir"]).resolve())
    checkpoint = raw.get("checkpoint")
    if not checkpoint:
        raise ConfigError("checkpoint: a directory for Spark's streaming checkpoints is required")
    tables = [_table(t, base, i) for i, t in enumerate(raw.get("tables") or [])]
    if not tables:
        raise ConfigError("tables: map at least one topic to a table")
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        raise ConfigError("tables: names must be unique")
    catalog = {str(k): str(v) for k, v in (raw.get("catalog") or {}).items()}
    if any(t.format == "iceberg" for t in tables) and not catalog:
        raise ConfigError("catalog: iceberg tables need a catalog (type: sql, uri, warehouse)")
    max_offsets = raw.get("max_offsets_per_trigger")
    return PipelineConfig(
        name=name,
        source=source,
        checkpoint=str((base / str(checkpoint)).resolve()),
        tables=tables,
        trigger=str(raw.get("trigger", "available-now")),
        max_offsets_per_trigger=int(max_offsets) if max_offsets else None,
        starting_offsets=str(raw.get("starting_offsets", "earliest")),
        catalog=catalog,
        spark={str(k): str(v) for k, v in (raw.get("spark") or {}).items()},
    )
