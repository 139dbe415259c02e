"""The admin side of transactions at a partition's owner: its active producers (Kafka's DescribeProducers).

Kafka answers from the partition leader's producer state: every producer id it still holds, with its epoch, the
last sequence and timestamp it wrote, the coordinator epoch of its last marker and the first offset of its open
transaction (-1: none). Here the same comes from the owner's ProducerStates (kafscale.broker.producer_state).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kafscale.broker.producer_state import ProducerStates


@dataclass(frozen=True, slots=True)
class ActiveProducer:
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_txn_start_offset: int


@dataclass(slots=True)
class PartitionProducers:
    """DescribeProducers of one partition: a Kafka error code, and its active producers by producer id."""

    error: int
    producers: list[ActiveProducer] = field(default_factory=list)


def active_producers(states: ProducerStates) -> list[ActiveProducer]:
    return [ActiveProducer(pid, e.epoch, e.last_seq, e.last_timestamp, e.coordinator_epoch, e.txn_first)
            for pid, e in sorted(states.entries.items())]
