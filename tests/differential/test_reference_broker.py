"""The reference brokers themselves, end to end: each is the Apache Kafka version it claims to be, and a client
creates a topic, produces, consumes and lists offsets on it. The differential cases build on this."""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from kafscale.protocol import make, request_class
from kafscale.testing.kafka_reference import ReferenceKafka
from tests.integration.conftest import KafkaWire

API_VERSIONS, FETCH, LIST_OFFSETS = 18, 1, 2


def test_reference_serves_the_protocol_versions_of_its_release(reference: ReferenceKafka) -> None:
    """Kafka 4.0 removed Fetch v0-3 and ListOffsets v0 (KIP-896); 3.9 still has them."""
    with KafkaWire(reference.port) as wire:
        answer = wire.call(make(request_class(API_VERSIONS, 3), client_software_name="kafscale-differential",
                                client_software_version="1"))
    assert answer.error_code == 0
    versions = {api.api_key: (api.min_version, api.max_version) for api in answer.api_keys}
    oldest = 4 if reference.major >= 4 else 0
    assert versions[FETCH][0] == oldest
    assert versions[LIST_OFFSETS][0] == (1 if reference.major >= 4 else 0)


def test_create_produce_consume_and_list_offsets(reference: ReferenceKafka, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": reference.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(timeout=30)

    delivered: list[tuple[int, int]] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        assert err is None, err
        delivered.append((msg.partition(), msg.offset()))

    producer = Producer({"bootstrap.servers": reference.bootstrap, "linger.ms": 0})
    for i in range(5):
        producer.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode(), partition=0, on_delivery=on_delivery)
        producer.flush(30)  # one batch per record: offsets 0..4 in order
    producer.produce(topic, key=b"other", value=b"p1", partition=1, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    assert delivered == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (1, 0)]

    consumer = Consumer({"bootstrap.servers": reference.bootstrap, "group.id": topic, "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        got: list[tuple[int, bytes | None, bytes | None]] = []
        deadline = time.monotonic() + 30
        while len(got) < 5 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append((msg.offset(), msg.key(), msg.value()))
    finally:
        consumer.close()
    assert got == [(i, f"k{i}".encode(), f"v{i}".encode()) for i in range(5)]

    def list_offsets(spec: OffsetSpec) -> dict[int, int]:
        futures = admin.list_offsets({TopicPartition(topic, p): spec for p in (0, 1)}, request_timeout=30)
        return {tp.partition: future.result().offset for tp, future in futures.items()}

    assert list_offsets(OffsetSpec.earliest()) == {0: 0, 1: 0}
    assert list_offsets(OffsetSpec.latest()) == {0: 5, 1: 1}


def test_a_cluster_id_that_starts_with_a_dash_formats(tmp_path: Path) -> None:
    """A random Kafka Uuid starts with '-' one time in 64; StorageTool took `-t -…` for a missing argument."""
    kafka = ReferenceKafka("4.4.0", parent_dir=tmp_path)
    kafka.cluster_id = "-" + "A" * 21
    with kafka:
        with KafkaWire(kafka.port) as wire:
            answer = wire.call(make(request_class(API_VERSIONS, 3), client_software_name="kafscale-differential",
                                    client_software_version="1"))
        assert answer.error_code == 0
