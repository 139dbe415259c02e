"""Committed offsets of one group: the stored value, and which ones have outlived their retention (KIP-211)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kafscale.groups.state import CONSUMER_PROTOCOL, Group, State

if TYPE_CHECKING:
    from kafscale.cluster.topics import TopicInfo

# Kafka's offset.metadata.max.bytes: longer commit metadata gets OFFSET_METADATA_TOO_LARGE.
MAX_METADATA_BYTES = 4096

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class OffsetEntry:
    offset: int
    leader_epoch: int
    metadata: str
    commit_ms: int
    expire_ms: int | None = None  # set only by OffsetCommit v2-v4 with an explicit retention time
    topic_id: str | None = None  # the topic's id when committed: a topic deleted and created again is another

    def to_value(self) -> dict[str, Any]:
        value: dict[str, Any] = {"offset": self.offset, "leader_epoch": self.leader_epoch, "metadata": self.metadata,
                                 "commit_ms": self.commit_ms}
        if self.expire_ms is not None:
            value["expire_ms"] = self.expire_ms
        if self.topic_id is not None:
            value["topic_id"] = self.topic_id
        return value

    @classmethod
    def from_value(cls, value: dict[str, Any]) -> OffsetEntry:
        return cls(int(value["offset"]), int(value.get("leader_epoch", -1)), str(value.get("metadata", "")),
                   int(value["commit_ms"]), value.get("expire_ms"), value.get("topic_id"))

    def belongs_to(self, topic: TopicInfo | None) -> bool:
        """Whether this offset is of the topic that exists now. Kafka deletes a topic's committed offsets with
        the topic; here they stop counting at once (and are removed by the group's coordinator soon after)."""
        return topic is not None and self.topic_id in (None, str(topic.id))


def expired_offsets(group: Group, offsets: dict[TopicPartition, OffsetEntry], now_ms: int,
                    retention_ms: int) -> list[TopicPartition]:
    """Kafka's GroupMetadata.removeExpiredOffsets.

    * A consumer group that is Empty: retention counts from when it became Empty, so a group whose members
      left keeps its offsets for the whole retention period however old the last commit.
    * A Stable consumer group: only offsets of topics it no longer subscribes to expire, by commit time.
    * A standalone group (offsets only, never joined): by commit time.
    An explicit expiry from OffsetCommit v2-v4 takes precedence everywhere it applies.
    """
    if group.protocol_type is not None and group.state is State.EMPTY:
        base_ms: int | None = int(group.state_since * 1000)
        skip: set[str] = set()
    elif group.protocol_type == CONSUMER_PROTOCOL and group.state is State.STABLE:
        topics = group.subscribed_topics()
        if topics is None:
            return []
        base_ms, skip = None, topics
    elif group.protocol_type is None:
        base_ms, skip = None, set()
    else:
        return []
    expired = []
    for tp, entry in offsets.items():
        if tp[0] in skip:
            continue
        if entry.expire_ms is not None:
            if now_ms >= entry.expire_ms:
                expired.append(tp)
        elif now_ms - (entry.commit_ms if base_ms is None else base_ms) >= retention_ms:
            expired.append(tp)
    return expired
