"""Spotting a producer that can send nothing more until the broker answers it.

An acks=all answer waits for the partition's flush, which seals a window on the next flush tick
(kafscale.broker.flush). A producer keeps few requests in flight, and once it is at its limit the rest of the
interval adds none of its data to the windows, only latency: its throughput becomes its limit per flush round
trip. Then the partitions it waits on are asked to flush at once (Broker.flush_now). The segments are as large as
they would have been, as nothing more was coming from it. The limits:

* Kafka's: at most 5 requests in flight per connection for an idempotent producer (KIP-98; the Java producer's
  max.in.flight.requests.per.connection, librdkafka's max.in.flight). The Java producer keeps the same 5 when it
  is not idempotent (its default whether or not), and so do sarama (MaxOpenRequests) and most other clients: a
  plain acks=all producer with 5 requests waiting on a connection is taken as blocked too, unless it is
  librdkafka, whose plain producer keeps up to a million in flight. A client set to more than 5 only has its
  windows sealed sooner: smaller segments, never a lost or reordered record.
* librdkafka's own, per partition: it compares the *records* in flight on a partition with that 5
  (rdkafka_broker.c, rd_kafka_toppar_producer_serve), so a partition with a request of 5 records or more waiting
  gets no second one. Against a few shards a connection carries few partitions and never reaches 5 requests: this
  is the limit that binds. Clients built on librdkafka say so in ApiVersions ("...-rdkafka-2.x" or "librdkafka").

The records of plain producers carry no producer id, so a blocked plain producer seals the open windows of its
partitions that hold any plain records (PLAIN).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from kafscale.storage.batch import HEADER_SIZE, MAGIC_OFFSET, MAGIC_V2, PRODUCER_ID_OFFSET, RECORD_COUNT_OFFSET

IDEMPOTENT_MAX_IN_FLIGHT = 5  # Kafka's limit for idempotent producers, per connection
PLAIN = -1  # the producer id of records sent without one

FlushNow = Callable[[Iterable[tuple[str, int]], int], None]  # (partitions, producer id): Broker.flush_now


def producer_id(records: bytes | bytearray | memoryview) -> int:
    """The producer id of the first record batch of a partition's records; PLAIN if none (not idempotent, not a
    v2 batch, too short to tell)."""
    if len(records) < HEADER_SIZE or records[MAGIC_OFFSET] != MAGIC_V2:
        return PLAIN
    return max(int.from_bytes(records[PRODUCER_ID_OFFSET:PRODUCER_ID_OFFSET + 8], "big", signed=True), PLAIN)


def record_count(records: bytes | bytearray | memoryview) -> int:
    """Records in the first batch (librdkafka sends one batch per partition and request)."""
    if len(records) < HEADER_SIZE:
        return 0
    return int.from_bytes(records[RECORD_COUNT_OFFSET:RECORD_COUNT_OFFSET + 4], "big")


def librdkafka(software_name: str, software_version: str) -> bool:
    """What a client built on librdkafka sends in ApiVersions v3+: its own name, or the binding's name with a
    version ending in "-rdkafka-<librdkafka version>" (confluent-kafka-python, -go, -dotnet)."""
    return software_name == "librdkafka" or "-rdkafka-" in software_version


class WaitingProduces:
    """One connection's acks=all Produce requests not answered yet (idempotent ones, and plain ones from clients
    other than librdkafka), and what they wait on."""

    __slots__ = ("_records", "_requests", "count", "counts_records")

    def __init__(self) -> None:
        self.count = 0
        self.counts_records = False  # a librdkafka client: its limit per partition is 5 records in flight
        self._requests: Counter[tuple[str, int]] = Counter()  # partition -> requests waiting on it
        self._records: Counter[tuple[str, int]] = Counter()  # partition -> records they carry there

    def track(self, answer: asyncio.Future[Any], producer: int, batches: list[tuple[str, int, int]],
              flush_now: FlushNow) -> None:
        """A request of `producer` just appended, as (topic, partition, records in its batch); `answer` completes
        when it is answered. Flushes at once what the producer can add nothing more to."""
        self.count += 1
        for topic, partition, records in batches:
            self._requests[(topic, partition)] += 1
            self._records[(topic, partition)] += records
        answer.add_done_callback(lambda _: self._answered(batches))
        if self.count >= IDEMPOTENT_MAX_IN_FLIGHT:  # nothing more on this connection: all it waits on
            flush_now(list(self._requests), producer)
        elif self.counts_records:
            blocked = [(t, p) for t, p, _ in batches if self._records[(t, p)] >= IDEMPOTENT_MAX_IN_FLIGHT]
            if blocked:
                flush_now(blocked, producer)

    def _answered(self, batches: list[tuple[str, int, int]]) -> None:
        self.count -= 1
        for topic, partition, records in batches:
            key = (topic, partition)
            self._records[key] -= records
            self._requests[key] -= 1
            if self._requests[key] <= 0:
                del self._requests[key]
                del self._records[key]
