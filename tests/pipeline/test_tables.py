"""The table processor: topics to Iceberg and Parquet tables, exactly once across crashes and restarts."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kafscale.cli import main
from kafscale.pipeline.config import parse_config
from kafscale.pipeline.runner import run_pipeline, start_queries
from kafscale.testing.iceberg_rest import IcebergRestServer
from tests.pipeline.conftest import Deployment, unique_topic
from tests.pipeline.kafka import consume_all, create_topic, produce

T0 = (int(time.time()) - 8 * 3600) * 1000  # recent: the broker's retention (7 days) must not delete it


def orders(first: int, count: int, *, coupon: bool = False) -> list[dict[str, Any]]:
    out = []
    for i in range(first, first + count):
        body: dict[str, Any] = {"id": i, "customer": f"c{i % 7}", "amount": i * 1.5}
        if coupon:
            body["coupon"] = f"SAVE{i % 3}"
        out.append({"key": str(i).encode(), "value": json.dumps(body).encode(), "headers": [],
                    "timestamp": T0 + i * 1000})
    return out


@pytest.fixture(params=["sql", "rest"])
def catalog(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The pipeline's Iceberg catalog: pyiceberg's SQL catalog, or a REST catalog over HTTP."""
    if request.param == "sql":
        yield {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/wh"}
        return
    with IcebergRestServer(tmp_path / "rest") as server:
        yield {"type": "rest", "uri": server.uri}


def iceberg_rows(catalog: dict[str, str]) -> Any:
    """The table as pyiceberg reads it through the same catalog."""
    from pyiceberg.catalog import load_catalog

    return load_catalog("kafscale", **catalog).load_table("shop.orders")  # a SQL catalog keys tables by its name


def iceberg_config(dep: Deployment, topic: str, tmp: Path, schema: dict[str, str], catalog: dict[str, str]) -> Any:
    return parse_config({
        "name": "shop", "source": dep.options, "checkpoint": str(tmp / "checkpoints"), "max_offsets_per_trigger": 200,
        "catalog": catalog,
        "tables": [{"name": "orders", "topics": [topic], "format": "iceberg", "table": "shop.orders",
                    "columns": "json", "schema": schema}],
    }, tmp)


def test_iceberg_table_is_exact_after_a_crash_and_evolves_its_schema(
        spark: Any, deployment_cloud: Deployment, tmp_path: Path, catalog: dict[str, str]) -> None:
    dep = deployment_cloud
    topic = unique_topic("shop-orders")
    create_topic(dep.bootstrap, topic, 2)
    produce(dep.bootstrap, topic, orders(0, 1000))
    schema = {"id": "long", "customer": "string", "amount": "double"}
    cfg = iceberg_config(dep, topic, tmp_path, schema, catalog)

    def crash(batch_id: int) -> None:
        if batch_id == 2:  # the table has batch 2, Spark's checkpoint does not: a replay must add nothing
            raise RuntimeError("simulated crash after the table commit")

    [(query, _)] = start_queries(spark, cfg, after_commit=crash)
    with pytest.raises(Exception, match="simulated crash"):
        query.awaitTermination(120)
    assert len(iceberg_rows(catalog).scan().to_arrow()) == 600

    assert run_pipeline(spark, cfg) == {"orders": 400}
    table = iceberg_rows(catalog).scan().to_arrow()
    assert sorted(table.column("id").to_pylist()) == list(range(1000))
    consumed = {(r.partition, r.offset): r for r in consume_all(dep.bootstrap, topic, 2)}
    for row in table.to_pylist():
        record = consumed.pop((row["partition"], row["offset"]))
        assert json.loads(record.value) == {"id": row["id"], "customer": row["customer"], "amount": row["amount"]}
        assert row["topic"] == topic and row["timestamp"].timestamp() * 1000 == record.timestamp
    assert not consumed

    # A field added to the declared schema becomes a new column; earlier rows have none.
    produce(dep.bootstrap, topic, orders(1000, 200, coupon=True))
    evolved = iceberg_config(dep, topic, tmp_path, {**schema, "coupon": "string"}, catalog)
    assert run_pipeline(spark, evolved) == {"orders": 200}
    table = iceberg_rows(catalog)
    assert "coupon" in [f.name for f in table.schema().fields]
    rows = table.scan().to_arrow().to_pylist()
    assert sorted(r["id"] for r in rows) == list(range(1200))
    assert all((r["coupon"] == f"SAVE{r['id'] % 3}") == (r["id"] >= 1000) for r in rows)


def test_parquet_table_stopped_halfway_and_resumed_by_the_cli(
        spark: Any, deployment_embedded: Deployment, tmp_path: Path) -> None:
    dep = deployment_embedded
    topic = unique_topic("raw-events")
    create_topic(dep.bootstrap, topic, 2)
    produce(dep.bootstrap, topic, orders(0, 800))
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump({
        "name": "raw", "source": dep.options, "checkpoint": "checkpoints", "max_offsets_per_trigger": 100,
        "trigger": "available-now",
        "tables": [{"name": "events", "topics": [topic], "format": "parquet", "path": "tables/events"}],
    }))
    cfg = parse_config(yaml.safe_load(config_file.read_text()), tmp_path)

    # Stopped while running: between or inside micro-batches, whatever the moment.
    [(query, writer)] = start_queries(spark, cfg, trigger="200 milliseconds")
    deadline = time.monotonic() + 60
    while writer.batches < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    query.stop()
    partial = spark.read.parquet(str(tmp_path / "tables/events")).count()
    assert 0 < partial < 800

    assert main(["pipeline", "run", str(config_file)]) == 0
    table = spark.read.parquet(str(tmp_path / "tables/events"))
    assert sorted(table.columns) == sorted(["key", "value", "topic", "partition", "offset", "timestamp",
                                            "timestampType", "headers", "date"])
    got = sorted((r.partition, r.offset, bytes(r.key), bytes(r.value)) for r in table.collect())
    expected = sorted((r.partition, r.offset, r.key, r.value) for r in consume_all(dep.bootstrap, topic, 2))
    assert got == expected
    assert {p.name for p in (tmp_path / "tables/events").iterdir() if not p.name.startswith("_")} == {f"topic={topic}"}
