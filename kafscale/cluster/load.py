"""Measured load: what each shard reports, off the data path, for the controller's scaling and balancing.

Rates are per second over the shard's last sampling interval. `busy` is the CPU its process used against the
CPU it may use (its Ray CPU request, at least one core): 1.0 is a shard that can take no more.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PartitionLoad:
    topic: str
    partition: int  # the physical partition, what moves (a topic's virtual partitions are summed into theirs)
    bytes_in: float  # produced record batch bytes per second
    bytes_out: float  # fetched record batch bytes per second

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.partition)

    @property
    def bytes(self) -> float:
        return self.bytes_in + self.bytes_out


@dataclass(frozen=True, slots=True)
class ShardLoad:
    shard_id: int
    busy: float  # fraction of the CPU the shard may use, over the interval
    bytes_in: float
    bytes_out: float
    requests: float  # Kafka requests answered per second
    interval_s: float  # how long the rates were measured over
    partitions: tuple[PartitionLoad, ...] = ()

    def partition_busy(self) -> dict[tuple[str, int], float]:
        """Each partition's share of `busy`, in proportion to its bytes in and out: the shard's CPU is spent
        mostly per byte. Everything is shared out, request overhead too, so a shard whose bytes are nearly all one
        partition's shows that partition as its whole load (which, moved, it mostly is)."""
        total = sum(p.bytes for p in self.partitions)
        if total <= 0:
            return {p.key: 0.0 for p in self.partitions}
        return {p.key: self.busy * p.bytes / total for p in self.partitions}
