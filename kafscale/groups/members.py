"""The values a consumer group's state machine (state.py) works with: its states, settings, members,
the answers it gives to JoinGroup and SyncGroup, and the consumer protocol's subscription format."""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

NEVER = float("inf")
CONSUMER_PROTOCOL = "consumer"


class State(enum.Enum):
    EMPTY = "Empty"
    PREPARING = "PreparingRebalance"
    COMPLETING = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class GroupSettings:
    min_session_timeout_ms: int = 6_000
    max_session_timeout_ms: int = 1_800_000
    initial_rebalance_delay_ms: int = 0
    # A member waiting for its first JoinGroup answer cannot heartbeat; Kafka drops it after this long.
    new_member_join_timeout_ms: int = 300_000
    max_size: int = 0  # 0 = unlimited


@dataclass(slots=True)
class JoinResult:
    error: ErrorCode
    member_id: str
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)  # only the leader's answer


@dataclass(slots=True)
class SyncResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(slots=True)
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    join_ticket: int | None = None  # set while a JoinGroup of this member waits
    sync_ticket: int | None = None  # set while a SyncGroup of this member waits
    is_new: bool = False  # joined during the current rebalance, has not had a JoinGroup answer yet
    heartbeat_deadline: float = NEVER

    def metadata(self, protocol: str | None) -> bytes:
        return next((data for name, data in self.protocols if name == protocol), b"")

    def names(self) -> set[str]:
        return {name for name, _ in self.protocols}

    def can_expire(self) -> bool:
        """Kafka's hasSatisfiedHeartbeat, negated: members waiting in a rebalance need no heartbeats, except new
        ones (their client may be gone while the JoinGroup waited)."""
        return self.is_new or (self.join_ticket is None and self.sync_ticket is None)


def subscribed_topics(metadata: bytes) -> set[str] | None:
    """Topics of a consumer-protocol subscription (version, [topic], user data, ...); None if it does not parse."""
    try:
        (count,) = struct.unpack_from(">i", metadata, 2)
        pos, topics = 6, set()
        for _ in range(count):
            (n,) = struct.unpack_from(">h", metadata, pos)
            topics.add(metadata[pos + 2:pos + 2 + n].decode())
            pos += 2 + n
        return topics if pos <= len(metadata) else None
    except (struct.error, UnicodeDecodeError):
        return None
