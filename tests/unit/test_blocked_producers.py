"""Which of a connection's waiting idempotent produces can get no more data from their producer
(kafscale.acceptor.blocked_producers): Kafka's 5 requests per connection, librdkafka's 5 records per partition."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from kafscale.acceptor.blocked_producers import WaitingProduces, librdkafka, producer_id, record_count


def batch(records: int, producer_id: int) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=producer_id,
                                        producer_epoch=0 if producer_id >= 0 else -1,
                                        base_sequence=0 if producer_id >= 0 else -1, batch_size=1 << 20)
    for i in range(records):
        builder.append(i, timestamp=1, key=None, value=b"v", headers=[])
    return bytes(builder.build())


def test_batches_name_their_idempotent_producer_and_how_many_records_they_hold() -> None:
    assert producer_id(batch(3, producer_id=7)) == 7 and record_count(batch(3, producer_id=7)) == 3
    assert producer_id(memoryview(batch(3, producer_id=7))) == 7
    assert producer_id(batch(3, producer_id=-1)) == -1
    assert producer_id(b"\x00" * 20) == -1  # too short to be a batch: no answer, no error
    legacy = bytearray(batch(1, producer_id=7))
    legacy[16] = 1  # a magic 1 message set has no producer id
    assert producer_id(legacy) == -1


def test_librdkafka_clients_are_told_apart_by_what_they_send_in_api_versions() -> None:
    assert librdkafka("librdkafka", "2.16.0")
    assert librdkafka("confluent-kafka-python", "2.16.0-rdkafka-2.16.0")
    assert not librdkafka("apache-kafka-java", "4.4.0")


class Flushes:
    def __init__(self) -> None:
        self.asked: list[set[tuple[str, int]]] = []

    def __call__(self, partitions: Iterable[tuple[str, int]], producer: int) -> None:
        assert producer == PRODUCER  # the owners seal only windows holding this producer's records
        self.asked.append(set(partitions))


PRODUCER = 7


async def test_the_fifth_request_waiting_on_a_connection_flushes_everything_the_five_wait_on() -> None:
    loop, flushes, waits = asyncio.get_running_loop(), Flushes(), WaitingProduces()
    answers = [loop.create_future() for _ in range(6)]
    for i in range(4):  # a Java producer: several partitions a request, a few records each
        waits.track(answers[i], PRODUCER, [("t", i, 3), ("t", 9, 3)], flushes)
    assert flushes.asked == []
    waits.track(answers[4], PRODUCER, [("t", 4, 3)], flushes)
    assert flushes.asked == [{("t", 0), ("t", 1), ("t", 2), ("t", 3), ("t", 4), ("t", 9)}]
    answers[0].set_result(None)
    await asyncio.sleep(0)
    waits.track(answers[5], PRODUCER, [("t", 5, 3)], flushes)  # at 5 again: ("t", 0) was answered and is not asked for
    assert flushes.asked[-1] == {("t", 1), ("t", 2), ("t", 3), ("t", 4), ("t", 5), ("t", 9)}
    for answer in answers[1:]:
        answer.set_result(None)
    await asyncio.sleep(0)
    assert waits.count == 0


async def test_librdkafka_is_blocked_on_a_partition_once_five_records_wait_there() -> None:
    loop, flushes, waits = asyncio.get_running_loop(), Flushes(), WaitingProduces()
    waits.counts_records = True
    small, large = loop.create_future(), loop.create_future()
    waits.track(small, PRODUCER, [("t", 0, 2), ("t", 1, 2)], flushes)
    assert flushes.asked == []  # librdkafka may still send another request for either partition
    waits.track(large, PRODUCER, [("t", 1, 3)], flushes)
    assert flushes.asked == [{("t", 1)}]  # 5 records wait on ("t", 1): it gets no second request
    small.set_result(None)
    large.set_result(None)
    await asyncio.sleep(0)
    other = loop.create_future()
    waits.track(other, PRODUCER, [("t", 1, 4)], flushes)  # the earlier ones were answered: 4 records wait now
    assert len(flushes.asked) == 1


async def test_a_java_client_is_not_held_to_librdkafkas_record_count() -> None:
    loop, flushes, waits = asyncio.get_running_loop(), Flushes(), WaitingProduces()
    waits.track(loop.create_future(), PRODUCER, [("t", 0, 500)], flushes)
    assert flushes.asked == []
