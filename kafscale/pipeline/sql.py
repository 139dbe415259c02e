"""Topics as Spark SQL views, for `kafscale sql`."""

from __future__ import annotations

import csv
import json
import re
from typing import Any, TextIO

from kafscale.pipeline.committed import topic_names
from kafscale.pipeline.location import Location

__all__ = ["print_rows", "register_topic_views", "run_query"]


def register_topic_views(spark: Any, options: dict[str, str], query: str | None = None) -> list[str]:
    """A temporary view per topic, named like the topic (quote names with '.' or '-' in backticks). With a
    query, only for the topics it mentions, since each view is planned against the metadata store."""
    names = topic_names(Location.from_options(options))
    if query is not None:
        words = set(re.findall(r"[A-Za-z0-9._-]+", query))
        names = [n for n in names if n in words]
    for name in names:
        spark.read.format("kafscale").options(**options).option("topic", name).load().createOrReplaceTempView(name)
    return names


def run_query(spark: Any, query: str, options: dict[str, str]) -> Any:
    register_topic_views(spark, options, query)
    return spark.sql(query)


def _plain(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if hasattr(value, "asDict"):
        return {k: _plain(v) for k, v in value.asDict().items()}
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def print_rows(df: Any, fmt: str, limit: int, out: TextIO) -> int:
    """Binary columns are shown as UTF-8 text (invalid bytes replaced), timestamps in ISO 8601."""
    rows = df.limit(limit).collect()
    columns = df.columns
    values = [[_plain(row[i]) for i in range(len(columns))] for row in rows]
    if fmt == "json":
        for row in values:
            out.write(json.dumps(dict(zip(columns, row, strict=True)), default=str) + "\n")
    elif fmt == "csv":
        writer = csv.writer(out)
        writer.writerow(columns)
        writer.writerows(values)
    else:
        cells = [[("NULL" if v is None else str(v)) for v in row] for row in values]
        widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
        line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
        title = " | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))
        out.write(f"{line}\n| {title} |\n{line}\n")
        for r in cells:
            out.write("| " + " | ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) + " |\n")
        out.write(line + "\n")
        out.write(f"({len(rows)} row{'s' if len(rows) != 1 else ''})\n")
    return len(rows)
