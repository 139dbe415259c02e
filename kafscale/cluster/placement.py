"""Placement: which shard leads each partition and coordinates each group. Decided here and nowhere else.

Metadata and FindCoordinator answer from it, and the broker routes and forwards by it. Today it is a pure
function of what the metadata store holds and of the shard list:
- a topic's record carries a `placement` list, spread at creation from a topic-dependent start (`spread`);
  partition p is led by shard `placement[p]` modulo the number of shards;
- a group is coordinated by shard `crc32(group id)` modulo the number of shards.
Readers only ever ask this object, so placement can become data the controller moves without them changing.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kafscale.cluster.topics import TopicInfo


@dataclass(frozen=True, slots=True)
class ShardAddress:
    """A shard as clients see it: a Kafka broker (node id = shard id) at an advertised address."""

    id: int
    host: str
    port: int


def spread(topic: str, partitions: int, shards: int, first: int = 0) -> list[int]:
    """The shards partitions first..partitions-1 of a new (or grown) topic start on: round robin from a
    topic-dependent shard, so that many small topics do not all start on shard 0."""
    shards = max(shards, 1)
    start = zlib.crc32(topic.encode()) % shards
    return [(start + p) % shards for p in range(first, partitions)]


class Placement:
    """One shard's view of who leads what, over the shard list it was given."""

    def __init__(self, shard_id: int, shards: list[ShardAddress] | None = None) -> None:
        self.shard_id = shard_id
        self.shards: list[ShardAddress] = list(shards or [])

    @property
    def single(self) -> bool:
        """One shard serves everything (a lone in-process broker, or a one-shard cluster)."""
        return len(self.shards) <= 1

    def address(self, shard_id: int) -> ShardAddress | None:
        return next((s for s in self.shards if s.id == shard_id), None)

    def leader_of(self, info: TopicInfo, partition: int) -> int:
        return info.placement[partition] % max(len(self.shards), 1)

    def leads(self, info: TopicInfo, partition: int) -> bool:
        return self.single or self.leader_of(info, partition) == self.shard_id

    def coordinator_of(self, group_id: str) -> int:
        return zlib.crc32(group_id.encode()) % max(len(self.shards), 1)

    def coordinates(self, group_id: str) -> bool:
        return self.single or self.coordinator_of(group_id) == self.shard_id
