"""`kafscale sql` over topic views with time-bounded segment pruning, and writing DataFrames to a topic."""

from __future__ import annotations

import datetime
import io
import json
import time
from typing import Any

import pytest

from kafscale.cli import main
from kafscale.pipeline.sql import print_rows, run_query
from tests.pipeline.conftest import Deployment, unique_topic
from tests.pipeline.kafka import Rec, consume_all, create_topic, produce, random_messages

T0 = (int(time.time()) - 8 * 3600) * 1000  # recent: the broker's retention (7 days) must not delete it
HOUR = 3_600_000


def test_sql_time_bound_reads_only_the_segments_it_needs(
        spark: Any, deployment_embedded: Deployment, capsys: pytest.CaptureFixture[str]) -> None:
    dep = deployment_embedded
    topic = unique_topic("clicks").replace("-", "_")
    create_topic(dep.bootstrap, topic, 1)
    for hour in range(6):  # six rounds an hour apart, each spanning several segments
        produce(dep.bootstrap, topic, random_messages(200, seed=hour, start_ms=T0 + hour * HOUR), partitions=1)
    everything = consume_all(dep.bootstrap, topic, 1)
    cut = datetime.datetime.fromtimestamp((T0 + 4 * HOUR) / 1000, tz=datetime.UTC)

    one_each = {**dep.options, "kafscale.maxPartitionBytes": "1"}  # a Spark partition per segment: countable
    all_rows = run_query(spark, f"SELECT offset FROM {topic}", one_each)
    recent = run_query(spark, f"SELECT offset, timestamp FROM {topic} WHERE timestamp >= '{cut.isoformat()}'",
                       one_each)
    # Segments whose max_ts lies before the bound are never planned, let alone fetched.
    assert recent.rdd.getNumPartitions() < all_rows.rdd.getNumPartitions() / 2
    assert sorted(r.offset for r in recent.collect()) == [r.offset for r in everything if r.timestamp >= T0 + 4 * HOUR]

    out = io.StringIO()
    assert print_rows(recent.orderBy("offset"), "json", 5, out) == 5
    first = json.loads(out.getvalue().splitlines()[0])
    assert first["offset"] == next(r.offset for r in everything if r.timestamp >= T0 + 4 * HOUR)

    code = main(["sql", f"SELECT count(*) AS n FROM {topic} WHERE timestamp < '{cut.isoformat()}'",
                 "--data-dir", dep.options["kafscale.data.dir"], "--format", "csv"])
    assert code == 0
    assert capsys.readouterr().out.splitlines()[-2:] == ["n", "800"]


def test_dataframes_are_produced_to_a_topic_with_acks_all(spark: Any, deployment_cloud: Deployment) -> None:
    dep = deployment_cloud
    topic = unique_topic("written")
    create_topic(dep.bootstrap, topic, 3)
    rows = [(f"k{i}".encode() if i % 5 else None, f"value {i}".encode(), [("n", str(i).encode()), ("x", None)], i % 3)
            for i in range(300)]
    df = spark.createDataFrame(rows, "key binary, value binary, headers array<struct<key: string, value: binary>>,"
                                     " partition int").repartition(2)
    df.write.format("kafscale").option("kafka.bootstrap.servers", dep.bootstrap).option("topic", topic) \
        .mode("append").save()

    got = consume_all(dep.bootstrap, topic, 3)
    assert len(got) == 300
    by_value = {r.value: r for r in got}
    for key, value, headers, partition in rows:
        record: Rec = by_value[value]
        assert (record.key, record.partition, record.headers) == (key, partition, tuple(headers))

    # What was written reads back through the source, byte for byte.
    back = spark.read.format("kafscale").options(**dep.options).option("topic", topic).load()
    assert sorted(bytes(r.value) for r in back.select("value").collect()) == sorted(v for _, v, _, _ in rows)
