"""Batch reads through Spark match what a Kafka consumer reads, record for record and byte for byte."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from kafscale.pipeline.committed import read_snapshot
from kafscale.pipeline.location import Location
from kafscale.pipeline.slices import count_data_loss
from kafscale.storage.keys import pack_key, pack_name, segment_key
from tests.pipeline.conftest import NAMESPACE, Deployment, unique_topic
from tests.pipeline.kafka import (
    consume_all,
    create_topic,
    produce,
    produce_xerial_snappy,
    random_messages,
    spark_records,
)

T0 = (int(time.time()) - 8 * 3600) * 1000  # recent: the broker's retention (7 days) must not delete it


def kafscale_df(spark: Any, deployment: Deployment, **options: str) -> Any:
    return spark.read.format("kafscale").options(**deployment.options).options(**options).load()


def test_every_codec_over_many_segments_matches_a_consumer(spark: Any, deployment_cloud: Deployment) -> None:
    topic = unique_topic("codecs")
    create_topic(deployment_cloud.bootstrap, topic, 2)
    for i, codec in enumerate(["none", "gzip", "snappy", "lz4", "zstd"]):
        produce(deployment_cloud.bootstrap, topic, random_messages(400, seed=i, start_ms=T0 + i * 10_000), codec=codec)
    produce_xerial_snappy(deployment_cloud.bootstrap, topic, random_messages(300, seed=9, start_ms=T0 + 60_000))

    expected = consume_all(deployment_cloud.bootstrap, topic, 2)
    assert len(expected) == 2300
    snap = read_snapshot(Location.from_options(deployment_cloud.options), topics=[topic])
    assert sum(len(log.segments) for log in snap.logs.values()) >= 20  # many segments, several per codec

    df = kafscale_df(spark, deployment_cloud, topic=topic)
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]
    assert spark_records(df) == expected
    assert {r.topic for r in df.select("topic").distinct().collect()} == {topic}


@pytest.fixture(scope="module")
def orders(deployment_embedded: Deployment) -> tuple[str, list]:
    """A topic on the embedded stores (read with kafscale.data.dir next to the live broker): two partitions,
    timestamps one second apart, many segments."""
    topic = unique_topic("orders")
    create_topic(deployment_embedded.bootstrap, topic, 2)
    produce(deployment_embedded.bootstrap, topic, random_messages(1200, seed=42, start_ms=T0, step_ms=1000))
    return topic, consume_all(deployment_embedded.bootstrap, topic, 2)


def test_offset_ranges_patterns_and_timestamps(spark: Any, deployment_embedded: Deployment, orders: tuple) -> None:
    topic, expected = orders
    dep = deployment_embedded
    assert spark_records(kafscale_df(spark, dep, topicPattern=topic[:-9] + ".*")) == expected

    window = kafscale_df(spark, dep, topics=topic, startingOffsets=f'{{"{topic}": {{"0": 100, "1": -2}}}}',
                         endingOffsets=f'{{"{topic}": {{"0": 250, "1": 40}}}}')
    assert spark_records(window) == [r for r in expected if (r.partition == 0 and 100 <= r.offset < 250)
                                     or (r.partition == 1 and r.offset < 40)]

    cut = T0 + 700 * 1000
    later = kafscale_df(spark, dep, topic=topic, startingTimestamp=str(cut))
    assert spark_records(later) == [r for r in expected if r.timestamp >= cut]

    assert kafscale_df(spark, dep, topic=topic, startingOffsets="latest").count() == 0


def test_large_segments_are_read_in_byte_ranges(spark: Any, deployment_embedded: Deployment, orders: tuple) -> None:
    topic, expected = orders
    one_each = {"kafscale.maxPartitionBytes": "1"}  # a Spark partition per slice, so that they can be counted
    whole = kafscale_df(spark, deployment_embedded, topic=topic, **one_each)
    ranged = kafscale_df(spark, deployment_embedded, topic=topic, **{"kafscale.split.bytes": "4096"}, **one_each)
    assert ranged.rdd.getNumPartitions() > whole.rdd.getNumPartitions()
    assert spark_records(ranged) == expected


def test_small_slices_are_packed_into_few_spark_partitions(spark: Any, deployment_embedded: Deployment,
                                                           orders: tuple) -> None:
    topic, expected = orders
    one_each = kafscale_df(spark, deployment_embedded, topic=topic, **{"kafscale.maxPartitionBytes": "1"})
    packed = kafscale_df(spark, deployment_embedded, topic=topic)  # default budget: 32 MiB of segments a task
    at_least = kafscale_df(spark, deployment_embedded, topic=topic, minPartitions="3")
    assert one_each.rdd.getNumPartitions() > 3
    assert packed.rdd.getNumPartitions() == 1
    assert at_least.rdd.getNumPartitions() >= 3
    for df in (packed, at_least):
        assert spark_records(df) == expected


def test_include_headers_false_drops_the_column_as_in_sparks_kafka_source(
        spark: Any, deployment_embedded: Deployment, orders: tuple) -> None:
    topic, expected = orders
    df = kafscale_df(spark, deployment_embedded, topic=topic, includeHeaders="false")
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    got = sorted((r.partition, r.offset, r.key, r.value) for r in df.collect())
    assert got == sorted((r.partition, r.offset, r.key, r.value) for r in expected)


def test_uncommitted_objects_are_ignored(spark: Any, deployment_embedded: Deployment, orders: tuple) -> None:
    topic, expected = orders
    snap = read_snapshot(Location.from_options(deployment_embedded.options), topics=[topic])
    log = snap.logs[(topic, 0)]
    # Uploads whose commit never happened (a crashed or fenced owner): a segment object at the high watermark,
    # and a pack no record names.
    objects = deployment_embedded.objects
    at = log.segments[0].stored(NAMESPACE, topic, 0)
    orphans = {segment_key(NAMESPACE, topic, 0, log.end): objects.get_range(at.key, at.start, at.size),
               pack_key(NAMESPACE, topic, pack_name(None, uuid.uuid4().hex)): objects.get(at.key)}
    for key, data in orphans.items():
        objects.put(key, data)
    try:
        assert spark_records(kafscale_df(spark, deployment_embedded, topic=topic)) == expected
    finally:
        for key in orphans:
            objects.delete(key)


def test_a_corrupt_segment_fails_the_job_or_is_skipped_and_counted(
        spark: Any, deployment_embedded: Deployment, tmp_path: Any) -> None:
    dep = deployment_embedded
    topic = unique_topic("corrupt")
    create_topic(dep.bootstrap, topic, 1)
    produce(dep.bootstrap, topic, random_messages(600, seed=7, start_ms=T0), partitions=1)
    expected = consume_all(dep.bootstrap, topic, 1)
    log = read_snapshot(Location.from_options(dep.options), topics=[topic]).logs[(topic, 0)]
    assert len(log.segments) >= 3
    victim = log.segments[1]
    at = victim.stored(NAMESPACE, topic, 0)  # an object of its own, or a byte range of a pack
    key = at.key
    data = bytearray(dep.objects.get(key))
    data[at.start + at.size // 2] ^= 0x40
    dep.objects.put(key, bytes(data))

    with pytest.raises(Exception, match=key):
        kafscale_df(spark, dep, topic=topic).count()

    lost = tmp_path / "lost"
    rows = spark_records(kafscale_df(spark, dep, topic=topic, failOnDataLoss="false",
                                     **{"kafscale.dataLossDir": str(lost)}))
    assert rows == [r for r in expected if not victim.base <= r.offset <= victim.last]
    skipped = count_data_loss(str(lost))
    assert [s["key"] for s in skipped] == [key]
    assert skipped[0]["offsets"] == [victim.base, victim.last + 1]


def test_a_topic_with_virtual_partitions_is_read_by_virtual_partition(spark: Any,
                                                                      deployment_embedded: Deployment) -> None:
    topic = unique_topic("virtual")
    create_topic(deployment_embedded.bootstrap, topic, 2, {"kafscale.virtual.partitions": "6"})
    produce(deployment_embedded.bootstrap, topic, random_messages(300, seed=7, start_ms=T0), partitions=6)
    expected = consume_all(deployment_embedded.bootstrap, topic, 6)
    assert len(expected) == 300 and {r.partition for r in expected} == set(range(6))
    assert spark_records(kafscale_df(spark, deployment_embedded, topic=topic)) == expected
