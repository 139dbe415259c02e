"""A compacted topic through the Spark source: once Kafscale has cleaned it, the source reads the compacted
segments with their gaps (whole, and in byte ranges between index entries) and returns, offset for offset, what a
Kafka consumer reads from the broker: each key's latest value, nothing a cleaning removed, no aborted record."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import Producer

from kafscale.pipeline.committed import read_snapshot
from kafscale.pipeline.location import Location
from tests.pipeline.conftest import Deployment, unique_topic
from tests.pipeline.kafka import create_topic
from tests.pipeline.test_transactions import PAD, consume_committed, rows


@pytest.fixture(params=["embedded", "cloud"])
def deployment(request: pytest.FixtureRequest) -> Deployment:
    return request.getfixturevalue(f"deployment_{request.param}")


def test_the_source_reads_a_cleaned_log_as_a_consumer_does(spark: Any, deployment: Deployment) -> None:
    topic = unique_topic("compacted")
    create_topic(deployment.bootstrap, topic, 2, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"})
    plain = Producer({"bootstrap.servers": deployment.bootstrap, "acks": "all", "linger.ms": 5})
    aborted = Producer({"bootstrap.servers": deployment.bootstrap, "transactional.id": f"{topic}-t", "linger.ms": 5})
    aborted.init_transactions(60)
    for version in range(4):
        for p in range(2):
            for k in range(6):
                key = f"k{k}-{p}".encode()  # rows() wants value == key + PAD
                plain.produce(topic, key=key, value=key + PAD, partition=p)
        assert plain.flush(60) == 0
        if version == 1:
            aborted.begin_transaction()
            for p in range(2):
                aborted.produce(topic, key=b"k0-%d" % p, value=b"k0-%d" % p + PAD, partition=p)
            aborted.abort_transaction(60)

    def cleaned() -> bool:
        snap = read_snapshot(Location.from_options(deployment.options), topics=[topic])
        return all(all(s.cleaned for s in snap.logs[(topic, p)].segments) for p in range(2))

    deadline = time.monotonic() + 60
    while not cleaned():
        assert time.monotonic() < deadline, "the topic was not cleaned within 60 s"
        time.sleep(0.5)

    def read(**options: str) -> Any:
        return spark.read.format("kafscale").options(**deployment.options).option("topic", topic).options(
            **options).load()

    expected = consume_committed(deployment.bootstrap, topic, 2)
    assert len(expected) == 12  # each key once
    assert rows(read()) == expected
    assert rows(read(**{"kafscale.split.bytes": "1024", "kafscale.maxPartitionBytes": "1"})) == expected
    assert rows(read(**{"kafka.isolation.level": "read_uncommitted"})) == expected  # the aborted ones are gone
