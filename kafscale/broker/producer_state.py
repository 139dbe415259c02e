"""Idempotent-producer bookkeeping of one partition: Kafka's sequence rules, per producer id.

Kafka keeps the last five batches of every producer so that a retried batch is recognised and
answered with the offsets it first got, instead of being written twice.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.storage.batch import BatchHeader

MAX_CACHED_BATCHES = 5
INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class BatchMeta:
    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    batches: deque[BatchMeta] = field(default_factory=lambda: deque(maxlen=MAX_CACHED_BATCHES))
    txn_first: int = -1  # first offset of the producer's open transaction in this partition; -1: none
    last_timestamp: int = -1  # the max timestamp of its last batch or marker (DescribeProducers)
    coordinator_epoch: int = -1  # the coordinator epoch of its last marker (DescribeProducers)

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1

    def copy(self) -> ProducerEntry:
        """A snapshot: the live entry keeps changing as later batches are appended."""
        return ProducerEntry(self.epoch, deque(self.batches, maxlen=MAX_CACHED_BATCHES), self.txn_first,
                             self.last_timestamp, self.coordinator_epoch)

    def to_value(self) -> dict[str, Any]:
        value: dict[str, Any] = {"epoch": self.epoch, "batches": [[b.first_seq, b.last_seq, b.base_offset,
                                                                     b.last_offset] for b in self.batches]}
        if self.txn_first >= 0:
            value["txn_first"] = self.txn_first
        if self.last_timestamp >= 0:
            value["last_timestamp"] = self.last_timestamp
        if self.coordinator_epoch >= 0:
            value["coordinator_epoch"] = self.coordinator_epoch
        return value

    @classmethod
    def from_value(cls, value: dict[str, Any]) -> ProducerEntry:
        entry = cls(epoch=int(value["epoch"]), txn_first=int(value.get("txn_first", -1)),
                    last_timestamp=int(value.get("last_timestamp", -1)),
                    coordinator_epoch=int(value.get("coordinator_epoch", -1)))
        for first, last, base, last_off in value.get("batches", []):
            entry.batches.append(BatchMeta(first, last, base, last_off))
        return entry


def _next_seq(seq: int) -> int:
    return 0 if seq == INT32_MAX else seq + 1


def _seq_add(seq: int, delta: int) -> int:
    return (seq + delta) % (INT32_MAX + 1)


class ProducerStates:
    """Only the partition owner's task touches this."""

    def __init__(self) -> None:
        self.entries: dict[int, ProducerEntry] = {}

    def check(self, header: BatchHeader) -> BatchMeta | ErrorCode | None:
        """None: append it. BatchMeta: a retry of that stored batch. ErrorCode: refuse the batch."""
        entry = self.entries.get(header.producer_id)
        first = header.base_sequence
        if first < 0:
            return ErrorCode.invalid_record
        last = _seq_add(first, header.last_offset_delta)
        if entry is None:
            # No history (new producer, or its state aged out): Kafka accepts it as the start.
            return None
        if header.producer_epoch < entry.epoch:
            return ErrorCode.invalid_producer_epoch
        if header.producer_epoch > entry.epoch:
            return None if first == 0 else ErrorCode.out_of_order_sequence_number
        for meta in entry.batches:
            if meta.first_seq == first and meta.last_seq == last:
                return meta
        if first != _next_seq(entry.last_seq):
            return ErrorCode.out_of_order_sequence_number
        return None

    def check_request(self, headers: list[BatchHeader]) -> ErrorCode | None:
        """Kafka's sequence rules for the batches of one produce request (retries already answered): each
        producer's first batch must follow what is stored, and its later batches must follow on."""
        previous: dict[int, BatchHeader] = {}
        for h in headers:
            if h.producer_id < 0:
                continue
            prev = previous.get(h.producer_id)
            if prev is None:
                verdict = self.check(h)
                if isinstance(verdict, ErrorCode):
                    return verdict
                if isinstance(verdict, BatchMeta):  # a retry mixed with new batches
                    return ErrorCode.duplicate_sequence_number
            elif (h.producer_epoch != prev.producer_epoch
                  or h.base_sequence != (prev.base_sequence + prev.last_offset_delta + 1) % 2**31):
                return ErrorCode.out_of_order_sequence_number
            previous[h.producer_id] = h
        return None

    def record(self, header: BatchHeader, base_offset: int) -> ProducerEntry:
        entry = self.entries.get(header.producer_id)
        if entry is None or header.producer_epoch != entry.epoch:
            # a new epoch keeps the open transaction: the coordinator's marker (with the newer epoch) ends it
            entry = ProducerEntry(epoch=header.producer_epoch, txn_first=entry.txn_first if entry else -1,
                                  coordinator_epoch=entry.coordinator_epoch if entry else -1)
            self.entries[header.producer_id] = entry
        entry.last_timestamp = header.max_timestamp
        entry.batches.append(BatchMeta(
            header.base_sequence, _seq_add(header.base_sequence, header.last_offset_delta),
            base_offset, base_offset + header.last_offset_delta,
        ))
        return entry

    def idle(self, now_ms: int, expiration_ms: int) -> list[int]:
        """Producers with no open transaction here whose last batch or marker is expiration_ms old, judged as Kafka
        judges them (producer.id.expiration.ms): by the timestamp the batch carried."""
        return [pid for pid, e in self.entries.items()
                if e.txn_first < 0 and now_ms - e.last_timestamp >= expiration_ms]

    def check_marker(self, producer_id: int, producer_epoch: int) -> ErrorCode | None:
        """A coordinator's marker carries the producer's current epoch or a newer one (it fenced the producer)."""
        entry = self.entries.get(producer_id)
        if entry is not None and producer_epoch < entry.epoch:
            return ErrorCode.invalid_producer_epoch
        return None

    def end_txn(self, producer_id: int, producer_epoch: int, coordinator_epoch: int = -1,
                timestamp_ms: int = -1) -> ProducerEntry:
        """A marker was appended: the producer's transaction here is over. A newer epoch fences the producer's
        older batches (their retries now get INVALID_PRODUCER_EPOCH) and restarts its sequences."""
        entry = self.entries.get(producer_id)
        if entry is None or producer_epoch > entry.epoch:
            entry = self.entries[producer_id] = ProducerEntry(epoch=producer_epoch)
        entry.txn_first = -1
        entry.coordinator_epoch, entry.last_timestamp = coordinator_epoch, timestamp_ms
        return entry
