"""Streaming reads: per-partition offsets in the checkpoint, maxOffsetsPerTrigger, Trigger.AvailableNow, resume."""

from __future__ import annotations

import time
from typing import Any

from tests.pipeline.conftest import Deployment, unique_topic
from tests.pipeline.kafka import Rec, consume_all, create_topic, produce, random_messages, spark_records

T0 = (int(time.time()) - 8 * 3600) * 1000  # recent: the broker's retention (7 days) must not delete it


def run_available_now(spark: Any, dep: Deployment, topic: str, checkpoint: str, limit: int) -> list[list[Rec]]:
    batches: list[list[Rec]] = []
    query = (spark.readStream.format("kafscale").options(**dep.options).option("topic", topic)
             .option("maxOffsetsPerTrigger", str(limit)).load()
             .writeStream.foreachBatch(lambda df, _id: batches.append(spark_records(df)))
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert not query.isActive
    assert query.exception() is None
    return batches


def test_stream_limits_batches_stops_when_caught_up_and_resumes(
        spark: Any, deployment_embedded: Deployment, tmp_path: Any) -> None:
    dep = deployment_embedded
    topic = unique_topic("stream")
    create_topic(dep.bootstrap, topic, 2)
    produce(dep.bootstrap, topic, random_messages(900, seed=1, start_ms=T0))
    checkpoint = str(tmp_path / "checkpoint")

    first = run_available_now(spark, dep, topic, checkpoint, limit=250)
    assert [len(b) for b in first if b] == [250, 250, 250, 150]
    everything = consume_all(dep.bootstrap, topic, 2)
    assert sorted(r for b in first for r in b) == everything

    # The checkpoint holds per-partition offsets: a restart reads only what came after.
    produce(dep.bootstrap, topic, random_messages(300, seed=2, start_ms=T0 + 10_000))
    second = run_available_now(spark, dep, topic, checkpoint, limit=1000)
    now = consume_all(dep.bootstrap, topic, 2)
    assert sorted(r for b in second for r in b) == [r for r in now if r not in set(everything)]
