"""One group id, both protocols (KIP-848 beside the classic one), with real consumers (confluent-kafka): a classic
group left empty becomes a consumer-protocol group when a `group.protocol=consumer` member joins it, and back, its
committed offsets kept each way; while a group of one protocol has members, a member of the other is refused
(INCONSISTENT_GROUP_PROTOCOL to a classic JoinGroup), and the running group goes on undisturbed."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer

from tests.integration.conftest import Cluster, unique_topic, wait_until

PARTITIONS = 2


def consumer(cluster: Cluster, group: str, protocol: str) -> Consumer:
    config: dict[str, Any] = {"bootstrap.servers": cluster.bootstrap, "group.id": group, "group.protocol": protocol,
                              "auto.offset.reset": "earliest", "enable.auto.commit": False}
    if protocol == "classic":
        config["session.timeout.ms"] = 6000
    return Consumer(config)


def consume(c: Consumer, count: int) -> list[bytes]:
    """`count` records, committed synchronously once read."""
    got: list[bytes] = []

    def more() -> bool:
        message = c.poll(0.2)
        if message is not None and message.error() is None:
            got.append(message.value())
        return len(got) >= count
    wait_until(more, what=f"{count} records")
    c.commit(asynchronous=False)
    return got


def test_an_empty_group_switches_protocol_and_keeps_its_offsets(broker_embedded: Cluster) -> None:
    topic, group = unique_topic("switch"), unique_topic("switch-g")
    with broker_embedded.wire() as wire:
        wire.create_topic(topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": broker_embedded.bootstrap})
    for i in range(30):
        producer.produce(topic, f"r{i}".encode(), partition=i % PARTITIONS)
    assert producer.flush(30) == 0
    seen: list[bytes] = []
    for protocol, count in (("classic", 10), ("consumer", 10), ("classic", 10)):
        c = consumer(broker_embedded, group, protocol)
        c.subscribe([topic])
        try:
            seen += consume(c, count)
        finally:
            c.close()  # leaves: the group is empty again
    assert sorted(seen) == sorted(f"r{i}".encode() for i in range(30)), "records skipped or read twice"


def test_a_member_of_the_other_protocol_is_refused_while_the_group_runs(broker_embedded: Cluster) -> None:
    topic, group = unique_topic("switch-busy"), unique_topic("switch-busy-g")
    with broker_embedded.wire() as wire:
        wire.create_topic(topic, PARTITIONS)
    modern = consumer(broker_embedded, group, "consumer")
    classic = consumer(broker_embedded, group, "classic")
    try:
        modern.subscribe([topic])
        wait_until(lambda: modern.poll(0.2) is None and len(modern.assignment()) == PARTITIONS,
                   what="the consumer-protocol member's assignment")
        classic.subscribe([topic])
        errors: list[int] = []

        def refused() -> bool:
            message = classic.poll(0.2)
            if message is not None and message.error() is not None:
                errors.append(message.error().code())
            return KafkaError.INCONSISTENT_GROUP_PROTOCOL in errors
        wait_until(refused, what="INCONSISTENT_GROUP_PROTOCOL for the classic member")
        assert classic.assignment() == []
        modern.poll(0.5)
        assert len(modern.assignment()) == PARTITIONS, "the running group was disturbed"
    finally:
        classic.close()
        modern.close()
