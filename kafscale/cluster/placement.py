"""Placement: which shard leads each partition and coordinates each group. Decided here and nowhere else.

Placement is data in the metadata store, written by the controller (kafscale.actors.controller) and by
whoever creates a topic; every shard watches it (kafscale.cluster.membership) and asks this object:
- partition p of a topic is led by the shard `placement[p]` of the topic's record, at leader epoch
  `leader_epochs[p]`; a move rewrites both with a compare-and-swap on the record;
- a group hashes to one of GROUP_SLOTS slots (as Kafka hashes a group to a __consumer_offsets partition),
  and the slot map `cluster/groups` names the shard coordinating each slot.
A leader or coordinator that is not among the live shards (its lease lapsed) serves nothing: clients get
LEADER_NOT_AVAILABLE / COORDINATOR_NOT_AVAILABLE until the controller moves its work.

A lone shard (one process, tests) has no peers and leads everything.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kafscale.cluster.topics import TopicInfo

GROUP_SLOTS = 64


@dataclass(frozen=True, slots=True)
class ShardAddress:
    """A shard as clients see it: a Kafka broker (node id = shard id) at an advertised address per listener
    (host and port are the first listener's)."""

    id: int
    host: str
    port: int
    listeners: tuple[tuple[str, str, int], ...] = ()  # (listener name, advertised host, port)

    def on(self, listener: str) -> tuple[str, int]:
        """The address clients that came in on `listener` are told (the first listener's if it has none)."""
        for name, host, port in self.listeners:
            if name == listener:
                return host, port
        return self.host, self.port


def spread(topic: str, partitions: int, shard_ids: Sequence[int], first: int = 0) -> list[int]:
    """The shards partitions first..partitions-1 of a new (or grown) topic start on: round robin from a
    topic-dependent shard, so that many small topics do not all start on the same shard."""
    ids = sorted(shard_ids) or [0]
    start = zlib.crc32(topic.encode()) % len(ids)
    return [ids[(start + p) % len(ids)] for p in range(first, partitions)]


def group_slot(group_id: str) -> int:
    return zlib.crc32(group_id.encode()) % GROUP_SLOTS


class Placement:
    """One shard's view of who leads what: the live shards and the group slot map (kept current by the
    cluster watch), read together with each topic's record."""

    def __init__(self, shard_id: int, shards: list[ShardAddress] | None = None, *, lone: bool = False,
                 group_slots: list[int] | None = None) -> None:
        self.shard_id = shard_id
        self.shards: list[ShardAddress] = sorted(shards or [], key=lambda s: s.id)
        self.lone = lone  # no peers: this shard serves every partition and group
        self.group_slots = group_slots  # None: not written yet; groups hash over the live shards
        self.draining: set[int] = set()  # drained (`kafscale cluster drain`): new topics avoid them

    def shard_ids(self) -> list[int]:
        return [s.id for s in self.shards] or [self.shard_id]

    def accepting_ids(self) -> list[int]:
        """The shards new partitions go to: the live ones that are not being drained."""
        return [i for i in self.shard_ids() if i not in self.draining] or self.shard_ids()

    def address(self, shard_id: int) -> ShardAddress | None:
        return next((s for s in self.shards if s.id == shard_id), None)

    def live(self, shard_id: int) -> bool:
        return self.lone or any(s.id == shard_id for s in self.shards)

    def leader_of(self, info: TopicInfo, partition: int) -> int:
        return self.shard_id if self.lone else info.placement[partition]

    def leader_epoch(self, info: TopicInfo, partition: int) -> int:
        return info.leader_epochs[partition] if partition < len(info.leader_epochs) else 0

    def leads(self, info: TopicInfo, partition: int) -> bool:
        return self.lone or info.placement[partition] == self.shard_id

    def coordinator_of(self, group_id: str) -> int:
        if self.lone:
            return self.shard_id
        slot = group_slot(group_id)
        if self.group_slots:
            return self.group_slots[slot % len(self.group_slots)]
        ids = self.shard_ids()
        return ids[slot % len(ids)]

    def leads_housekeeping(self) -> bool:
        """Cluster-wide chores (finishing topic deletions) fall to the live shard with the lowest id."""
        return self.lone or min(self.shard_ids()) == self.shard_id

    def coordinates(self, group_id: str) -> bool:
        return self.lone or self.coordinator_of(group_id) == self.shard_id
