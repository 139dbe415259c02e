"""S3 throttling, errors, resets and stalls (kafscale/testing/faulty_s3.py in front of a real SeaweedFS): at a
20% fault rate nothing acknowledged is lost or doubled, the broker restarts and recovers through the faults, and
produce is back within seconds of their end."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafscale.config import BrokerConfig
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.s3_store import S3Store
from kafscale.testing.faulty_s3 import FAULTS, FaultyS3Proxy
from kafscale.testing.inprocess import InProcessBroker
from kafscale.testing.s3_servers import SeaweedS3Server, unique_bucket_name

pytestmark = pytest.mark.timeout(180)
PARTITIONS = 4
# 20% of requests in all: throttled, failed, cut before or after the server acted, or answered late.
TWENTY_PERCENT = {"slowdown": 0.06, "internal": 0.04, "reset_before": 0.04, "reset_after": 0.03, "stall": 0.03}


@pytest.fixture
def proxy(seaweed_server: SeaweedS3Server) -> Iterator[tuple[FaultyS3Proxy, str]]:
    bucket = unique_bucket_name("faults")
    seaweed_server.store(bucket).close()
    proxy = FaultyS3Proxy(seaweed_server.endpoint_url, stall_s=1.0, seed=20261126)
    try:
        yield proxy, bucket
    finally:
        proxy.close()
        seaweed_server.delete_bucket(bucket)


def test_store_calls_through_twenty_percent_faults_all_succeed(proxy: tuple[FaultyS3Proxy, str],
                                                               seaweed_server: SeaweedS3Server) -> None:
    faulty, bucket = proxy
    store = S3Store(bucket, endpoint_url=faulty.endpoint_url, region=seaweed_server.region,
                    access_key=seaweed_server.access_key, secret_key=seaweed_server.secret_key)
    try:
        faulty.set_rates(**TWENTY_PERCENT)
        for i in range(60):
            body = f"object {i} ".encode() * 100
            store.put(f"plain/{i}", body)
            assert store.put_if_absent(f"once/{i}", body)  # a create cut after it took effect is still ours
            assert not store.put_if_absent(f"once/{i}", b"another")
            assert store.get(f"plain/{i}") == body
            assert store.get_range(f"once/{i}", 7, 3) == body[7:10]
            info = store.head(f"plain/{i}")
            assert info is not None and info.size == len(body)
        assert len(list(store.list("plain/"))) == 60
    finally:
        store.close()
    assert all(faulty.faults[f] > 0 for f in FAULTS), faulty.faults


def test_twenty_percent_faults_lose_nothing_acknowledged_and_produce_recovers_when_they_stop(
        proxy: tuple[FaultyS3Proxy, str], seaweed_server: SeaweedS3Server, tmp_path: Path) -> None:
    faulty, bucket = proxy

    def broker() -> InProcessBroker:
        return InProcessBroker(
            BrokerConfig(metrics_listen="", flush_interval_ms=20),
            meta=lambda: EmbeddedStore(tmp_path / "meta.db"),
            objects=lambda: S3Store(bucket, endpoint_url=faulty.endpoint_url, region=seaweed_server.region,
                                    access_key=seaweed_server.access_key, secret_key=seaweed_server.secret_key))

    acked: dict[tuple[int, int], bytes] = {}
    failed: list[KafkaError] = []
    with broker() as b:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic("faults", PARTITIONS)])["faults"].result(30)
        faulty.set_rates(**TWENTY_PERCENT)
        producer = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "enable.idempotence": True,
                             "linger.ms": 5, "delivery.timeout.ms": 60_000})

        def delivered(err: KafkaError | None, msg: object) -> None:
            if err is None:
                acked[(msg.partition(), msg.offset())] = msg.value()  # type: ignore[attr-defined]
            else:
                failed.append(err)

        end, i = time.monotonic() + 8, 0
        while time.monotonic() < end:
            producer.produce("faults", value=f"r{i}".encode(), partition=i % PARTITIONS, on_delivery=delivered)
            i += 1
            producer.poll(0.002)
        assert producer.flush(90) == 0
        assert len(acked) > 1000, f"only {len(acked)} records acknowledged under faults ({len(failed)} failed)"

    with broker() as b:  # restarted with the faults still on: recovery reads through them
        consumer = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "faults", "enable.auto.commit": False})
        consumer.assign([TopicPartition("faults", p, 0) for p in range(PARTITIONS)])
        stored: dict[tuple[int, int], bytes] = {}
        deadline = time.monotonic() + 90
        try:
            while len(stored) < len(acked) and time.monotonic() < deadline:
                for m in consumer.consume(1000, 0.5):
                    if m.error() is None:
                        stored[(m.partition(), m.offset())] = m.value()
        finally:
            consumer.close()
        for key, value in acked.items():
            assert stored.get(key) == value, f"acknowledged record at partition/offset {key} lost or changed"
        values = list(stored.values())
        assert len(values) == len(set(values)), "a record is stored twice"

        faulty.set_rates()  # the faults stop: the next produce goes through at once
        producer = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "enable.idempotence": True})
        started = time.monotonic()
        outcome: list[KafkaError | None] = []
        producer.produce("faults", value=b"after", on_delivery=lambda err, _m: outcome.append(err))
        producer.flush(30)
        assert outcome == [None]
        assert time.monotonic() - started < 5, "produce did not recover within seconds of the faults' end"
        print(f"faults {dict(faulty.faults)} of {faulty.forwarded + sum(faulty.faults.values())} requests; "
              f"{len(acked)} acknowledged, {len(failed)} failed; produce after: {time.monotonic() - started:.2f} s")
    # The faults really happened, and often: about a fifth of the requests. How many requests a run makes varies
    # with the machine's speed, so the floor is a share of them (a tenth, far below the expected fifth).
    made = sum(faulty.faults.values())
    requests = faulty.forwarded + made
    assert requests >= 150 and made >= requests / 10, (requests, faulty.faults)
    assert all(faulty.faults[f] > 0 for f in FAULTS), faulty.faults
