"""Spark's own Kafka source (spark-sql-kafka-0-10, the Java client inside) reads a Kafscale topic over TCP exactly as
it was produced: every record, key, value, header, partition, offset and timestamp, and the offset and timestamp
ranges it asks for with ListOffsets. The same checks run against Apache Kafka, so a difference is Kafscale's.

The Kafscale broker is the embedded deployment of tests/pipeline/conftest.py (16 KiB segments, 20 ms flushes): a
topic of a few thousand records spans many segments, and the source's fetches cross their boundaries."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest

from kafscale.testing.spark_kafka import spark_kafka_jars
from tests.pipeline.conftest import Deployment, unique_topic
from tests.pipeline.kafka import Rec, create_topic, produce, random_messages, spark_records
from tests.xdist_groups import on_reference

pytestmark = pytest.mark.timeout(300)

PARTITIONS = 3
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
PER_CODEC = 500
T0 = (int(time.time()) - 8 * 3600) * 1000  # recent: within both brokers' 7-day retention


@pytest.fixture(params=["kafscale", pytest.param("reference", marks=on_reference)])
def bootstrap(request: pytest.FixtureRequest) -> str:
    if request.param == "reference":
        return str(request.getfixturevalue("kafka_reference").bootstrap)
    deployment: Deployment = request.getfixturevalue("deployment_embedded")
    return deployment.bootstrap


@pytest.fixture
def kafka_source(spark: Any) -> Any:
    """The session, checked to carry Spark's Kafka source (the spark fixture adds it when it is installed)."""
    try:
        jars = spark_kafka_jars()
    except FileNotFoundError as e:
        pytest.fail(str(e), pytrace=False)
    loaded = spark.sparkContext.getConf().get("spark.jars", "")
    missing = [j.name for j in jars if str(j) not in loaded]
    assert not missing, f"the session started without {missing}: jars must be set before the first getOrCreate()"
    return spark


@pytest.fixture
def produced(bootstrap: str) -> tuple[str, list[Rec]]:
    """A topic written by librdkafka in every codec, one second between timestamps, and the records as produced."""
    topic = unique_topic("spark-kafka")
    create_topic(bootstrap, topic, PARTITIONS)
    records: list[Rec] = []
    next_offset = [0] * PARTITIONS
    for n, codec in enumerate(CODECS):
        messages = random_messages(PER_CODEC, seed=n, start_ms=T0 + n * PER_CODEC * 1000, step_ms=1000)
        for i, m in enumerate(messages):
            m["partition"] = p = (n * PER_CODEC + i) % PARTITIONS
            records.append(Rec(p, next_offset[p], m["key"], m["value"], tuple(tuple(h) for h in m["headers"]),
                               m["timestamp"], 0))  # 0: CreateTime, the topic's default
            next_offset[p] += 1
        produce(bootstrap, topic, messages, codec=codec, partitions=PARTITIONS, idempotent=True)  # offsets as given
    return topic, sorted(records)


def kafka_df(spark: Any, bootstrap: str, topic: str, **options: str) -> Any:
    return (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
            .option("includeHeaders", "true").options(**options).load())


def test_reads_every_record_as_produced(kafka_source: Any, bootstrap: str, produced: tuple[str, list[Rec]]) -> None:
    topic, expected = produced
    df = kafka_df(kafka_source, bootstrap, topic, startingOffsets="earliest", endingOffsets="latest")
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]
    assert spark_records(df) == expected
    assert {r.topic for r in df.select("topic").distinct().collect()} == {topic}
    # Split into more Spark partitions than Kafka partitions: consumers that start and stop inside record batches.
    split = kafka_df(kafka_source, bootstrap, topic, startingOffsets="earliest", minPartitions="11")
    assert split.rdd.getNumPartitions() >= 11
    assert spark_records(split) == expected


def test_offset_and_timestamp_ranges(kafka_source: Any, bootstrap: str, produced: tuple[str, list[Rec]]) -> None:
    topic, expected = produced
    spark = kafka_source
    window = kafka_df(spark, bootstrap, topic, startingOffsets=f'{{"{topic}": {{"0": 100, "1": -2, "2": 777}}}}',
                      endingOffsets=f'{{"{topic}": {{"0": 250, "1": 40, "2": -1}}}}')
    assert spark_records(window) == [r for r in expected if (r.partition == 0 and 100 <= r.offset < 250)
                                     or (r.partition == 1 and r.offset < 40) or (r.partition == 2 and r.offset >= 777)]

    # ListOffsets by timestamp: the first offset at or after each bound, per partition.
    start, end = T0 + 700 * 1000, T0 + 1900 * 1000 + 1
    timed = kafka_df(spark, bootstrap, topic, startingTimestamp=str(start), endingTimestamp=str(end))
    assert spark_records(timed) == [r for r in expected if start <= r.timestamp < end]
    # Bounds between two records' timestamps, and an end past all of them (ListOffsets answers no offset: -1).
    start = T0 + 333 * 1000 + 500
    between = kafka_df(spark, bootstrap, topic, startingTimestamp=str(start), endingTimestamp=str(T0 + 10**9))
    assert spark_records(between) == [r for r in expected if r.timestamp >= start]
    # A start past every record's timestamp: no offset, which the source refuses (by default) rather than guess.
    with pytest.raises(Exception, match="No offset matched"):
        kafka_df(spark, bootstrap, topic, startingTimestamp=str(T0 + 10**9)).count()


def test_streaming_read_and_the_kafka_sink(kafka_source: Any, bootstrap: str, produced: tuple[str, list[Rec]],
                                           tmp_path: Any) -> None:
    """A micro-batch query (trigger availableNow) reads what the batch read does; the Kafka sink (an idempotent
    Java producer) writes it back, keys, values, headers and partitions kept."""
    topic, expected = produced
    spark = kafka_source
    stream = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
              .option("startingOffsets", "earliest").option("includeHeaders", "true")
              .option("maxOffsetsPerTrigger", "900").load())
    name = f"spark_kafka_{time.monotonic_ns()}"
    query = (stream.writeStream.format("memory").queryName(name).trigger(availableNow=True)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    try:
        assert query.awaitTermination(180)
        assert query.exception() is None
        assert len(query.recentProgress) >= len(expected) // 900  # several micro-batches, not one
        assert spark_records(spark.table(name)) == expected
    finally:
        query.stop()

    copy = unique_topic("spark-kafka-copy")
    create_topic(bootstrap, copy, PARTITIONS)
    source = kafka_df(spark, bootstrap, topic, startingOffsets="earliest")
    (source.selectExpr("key", "value", "headers", "partition").write.format("kafka")
     .option("kafka.bootstrap.servers", bootstrap).option("topic", copy).save())
    copied = spark_records(kafka_df(spark, bootstrap, copy, startingOffsets="earliest"))
    # One writer task per source partition (a Kafka partition each here), so each partition keeps its order. The
    # sink cannot set timestamps: the producer stamps its own.
    assert [replace(r, timestamp=0) for r in copied] == [replace(r, timestamp=0) for r in expected]


def test_log_append_time(kafka_source: Any, bootstrap: str) -> None:
    """A LogAppendTime topic: the broker stamps each batch, and the source reports timestampType 1 with the broker's
    time, not the producer's."""
    topic = unique_topic("spark-kafka-lat")
    create_topic(bootstrap, topic, PARTITIONS, {"message.timestamp.type": "LogAppendTime"})
    messages = random_messages(300, seed=7, start_ms=T0)  # the producer's timestamps, 8 hours old
    before = int(time.time() * 1000)
    produce(bootstrap, topic, messages, partitions=PARTITIONS, idempotent=True)
    after = int(time.time() * 1000)
    got = spark_records(kafka_df(kafka_source, bootstrap, topic, startingOffsets="earliest"))
    by_partition = sorted(((i % PARTITIONS, m["key"], m["value"]) for i, m in enumerate(messages)),
                          key=lambda r: r[0])  # stable: each partition in the order produced
    assert [(r.partition, r.key, r.value) for r in got] == by_partition
    assert {r.timestamp_type for r in got} == {1}
    assert all(before - 1000 <= r.timestamp <= after + 1000 for r in got), (before, after, got[0].timestamp)


def test_read_committed_skips_aborted_transactions(kafka_source: Any, bootstrap: str) -> None:
    """Transactions committed, aborted, committed: read_committed sees the committed records alone, in order, past
    the control batches and the aborted records' offsets; read_uncommitted sees every data record."""
    from confluent_kafka import Producer

    topic = unique_topic("spark-kafka-txn")
    create_topic(bootstrap, topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-tx", "linger.ms": 5})
    producer.init_transactions(30)
    written: list[tuple[int, bytes, bool]] = []  # partition, value, committed; in the order produced
    for txn, commit in enumerate([True, False, True, False, True]):
        producer.begin_transaction()
        for i in range(200):
            value = f"t{txn}-{i}".encode()
            producer.produce(topic, value=value, partition=i % PARTITIONS)
            written.append((i % PARTITIONS, value, commit))
        producer.flush(30)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)

    def values(isolation: str) -> list[tuple[int, bytes]]:
        df = kafka_df(kafka_source, bootstrap, topic, startingOffsets="earliest",
                      **{"kafka.isolation.level": isolation})
        return [(r.partition, r.value) for r in spark_records(df)]  # by partition, then offset

    in_order = sorted(written, key=lambda w: w[0])  # stable: each partition in the order produced
    assert values("read_committed") == [(p, v) for p, v, committed in in_order if committed]
    assert values("read_uncommitted") == [(p, v) for p, v, _ in in_order]
