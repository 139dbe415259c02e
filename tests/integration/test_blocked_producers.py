"""An idempotent producer at its in-flight limit is answered after the flush, not after the flush interval
(kafscale.acceptor.blocked_producers): with a flush interval of several seconds, a blocked producer's records are
acknowledged in a fraction of it, while a plain producer's wait the interval as before; with
blocked_flush_min_bytes set (256 KiB here), a blocked producer's few bytes wait too. Each case runs with a plain
topic's segments packed (`pack_segments`: windows end on the shard's ticks, multiples of the interval on the
monotonic clock) and not; a producer starts right after a tick, so that waiting for the tick is waiting the
interval."""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from confluent_kafka import Producer

from kafscale.config import BrokerConfig
from kafscale.protocol.codec import make, request_class
from kafscale.protocol.errors import ErrorCode
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.local_store import LocalDirStore
from kafscale.testing.inprocess import InProcessBroker
from tests.integration.conftest import KafkaWire

INTERVAL_S = 4.0
MIN_BYTES = 256 * 1024
INIT_PRODUCER_ID = 22


@pytest.fixture(params=[True, False], ids=["packed", "objects"])
def broker(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[InProcessBroker]:
    config = BrokerConfig(metrics_listen="", flush_interval_ms=int(INTERVAL_S * 1000),
                          blocked_flush_min_bytes=MIN_BYTES, pack_segments=request.param)
    with InProcessBroker(config, meta=lambda: EmbeddedStore(tmp_path / "meta.db"),
                         objects=lambda: LocalDirStore(tmp_path / "objects")) as b:
        yield b


def port(b: InProcessBroker) -> int:
    return int(b.bootstrap.rsplit(":", 1)[1])


def after_a_tick() -> None:
    """Wait for the monotonic clock to pass a multiple of the interval (the broker runs in this process)."""
    time.sleep(INTERVAL_S - time.monotonic() % INTERVAL_S + 0.01)


def acknowledged_after(b: InProcessBroker, topic: str, conf: dict[str, object], records: int, size: int) -> float:
    """Seconds from the first produce() until every record is acknowledged (one batch: linger outlasts the loop)."""
    producer = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 200, **conf})
    producer.list_topics(topic, timeout=10)
    failed: list[object] = []
    after_a_tick()
    started = time.monotonic()
    for i in range(records):
        producer.produce(topic, f"r{i}".encode().ljust(size, b"."), partition=0,
                         on_delivery=lambda err, _: err is not None and failed.append(err))
    assert producer.flush(3 * INTERVAL_S) == 0 and not failed, failed
    return time.monotonic() - started


def test_librdkafkas_idempotent_producer_is_answered_without_waiting_for_the_flush_interval(
        broker: InProcessBroker) -> None:
    with KafkaWire(port(broker)) as wire:
        wire.create_topic("blocked-rdkafka", 1)
    idempotent, plain = {"enable.idempotence": True}, {"enable.idempotence": False}
    # librdkafka sends no second request to a partition while 5 of its records are in flight there: 50 of 8 KiB
    # (400 KiB, one request) are all it can send, so they are flushed at once.
    assert acknowledged_after(broker, "blocked-rdkafka", idempotent, 50, 8192) < INTERVAL_S / 2
    # A plain producer could send more: its records wait for the interval, as before.
    assert acknowledged_after(broker, "blocked-rdkafka", plain, 50, 8192) >= INTERVAL_S * 0.9
    # A blocked producer's few bytes wait too, to share an object with whatever else comes.
    assert acknowledged_after(broker, "blocked-rdkafka", idempotent, 50, 10) >= INTERVAL_S * 0.9


def test_by_default_a_blocked_producers_few_bytes_are_flushed_at_once_too(tmp_path: Path) -> None:
    config = BrokerConfig(metrics_listen="", flush_interval_ms=int(INTERVAL_S * 1000))
    assert config.blocked_flush_min_bytes == 0
    with InProcessBroker(config, meta=lambda: EmbeddedStore(tmp_path / "meta.db"),
                         objects=lambda: LocalDirStore(tmp_path / "objects")) as b:
        with KafkaWire(port(b)) as wire:
            wire.create_topic("blocked-default", 1)
        assert acknowledged_after(b, "blocked-default", {"enable.idempotence": True}, 50, 10) < INTERVAL_S / 2


def idempotent_batch(producer_id: int, epoch: int, value: bytes) -> bytes:
    """One record; a producer id of -1 makes it a plain producer's."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=producer_id,
                                        producer_epoch=epoch, base_sequence=0 if producer_id >= 0 else -1,
                                        batch_size=1 << 20)
    builder.append(0, timestamp=int(time.time() * 1000), key=None, value=value, headers=[])
    return bytes(builder.build())


def pipelined(wire: KafkaWire, topic: str, partitions: range, idempotent: bool = True) -> float:
    """An idempotent (or plain) producer (no ApiVersions: not librdkafka) sends one one-record request per partition
    without waiting; seconds until all are answered."""
    producer, epoch = -1, -1
    if idempotent:
        init = wire.call(make(request_class(INIT_PRODUCER_ID, 4), transactional_id=None,
                              transaction_timeout=datetime.timedelta(seconds=60), producer_id=-1, producer_epoch=-1))
        assert init.error_code == ErrorCode.none
        producer, epoch = init.producer_id, init.producer_epoch
    after_a_tick()
    started = time.monotonic()
    for p in partitions:
        record = idempotent_batch(producer, epoch, bytes(300 * 1024))  # past the minimum
        wire.send(wire.produce_request(topic, p, record))
    for _ in partitions:
        _, answer = wire.receive()
        assert answer.responses[0].partition_responses[0].error_code == ErrorCode.none
    return time.monotonic() - started


def test_five_idempotent_requests_waiting_on_a_connection_are_answered_without_waiting_for_the_interval(
        broker: InProcessBroker) -> None:
    with KafkaWire(port(broker)) as wire:
        wire.create_topic("blocked-five", 5)
    with KafkaWire(port(broker)) as wire:  # Kafka's limit: the producer can send a sixth only once one is answered
        assert pipelined(wire, "blocked-five", range(5)) < INTERVAL_S / 2
    with KafkaWire(port(broker)) as wire:  # four: it could send more, so they wait for the interval
        assert pipelined(wire, "blocked-five", range(4)) >= INTERVAL_S * 0.9


def test_five_plain_requests_waiting_on_a_connection_are_answered_without_waiting_for_the_interval(
        broker: InProcessBroker) -> None:
    """The Java producer (and sarama, and most clients but librdkafka) keeps 5 requests in flight per connection
    whether or not it is idempotent: a plain acks=all producer at that limit is blocked as well."""
    with KafkaWire(port(broker)) as wire:
        wire.create_topic("blocked-plain", 5)
    with KafkaWire(port(broker)) as wire:
        assert pipelined(wire, "blocked-plain", range(5), idempotent=False) < INTERVAL_S / 2
    with KafkaWire(port(broker)) as wire:  # four: it could send more, so they wait for the interval
        assert pipelined(wire, "blocked-plain", range(4), idempotent=False) >= INTERVAL_S * 0.9
