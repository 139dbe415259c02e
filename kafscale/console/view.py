"""What the console's pages show, as typed results, and the interface the API reads and changes the cluster by.

The API (api.py) knows only `ClusterView`; kafka_view.py implements it with Kafka clients. Every failure the
cluster answers with becomes a `ConsoleError` naming the thing, with the HTTP status the API answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

ResetTo = Literal["earliest", "latest", "offset", "timestamp"]


class ConsoleError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class PartitionState:
    partition: int
    leader: int
    earliest: int | None  # None: the partition did not answer (no leader for now, in the middle of a move)
    latest: int | None
    size: int | None = None  # bytes stored (DescribeLogDirs); None: unknown to the console's principal


@dataclass(frozen=True, slots=True)
class TopicSummary:
    name: str
    partitions: int
    records: int  # latest minus earliest offsets, summed: what is readable (markers and compaction aside)
    internal: bool = False


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    name: str
    value: str | None
    source: str
    is_default: bool
    sensitive: bool
    read_only: bool


@dataclass(frozen=True, slots=True)
class TopicStorage:
    """What only the cluster's own metadata tells of a topic (the controller answers it)."""

    physical: int  # the partitions stored, which a virtual topic's share (docs/virtual-partitions.md); 0: plain
    sizes: dict[int, int]  # partition -> bytes stored (the shards' DescribeLogDirs answers)


@dataclass(frozen=True, slots=True)
class TopicDetail:
    name: str
    partitions: list[PartitionState]
    configs: list[ConfigEntry]
    # A virtual topic's physical partitions (partition v is stored in v % physical); 0: a plain topic, or not
    # known (beside a broker without a controller, a virtual topic shows its kafscale.virtual.partitions config).
    physical: int = 0


@dataclass(frozen=True, slots=True)
class Header:
    key: str
    value: str | None  # base64


@dataclass(frozen=True, slots=True)
class Message:
    partition: int
    offset: int
    timestamp: int
    timestamp_type: str
    key: str | None  # base64: the page decodes it as text, JSON or hex
    value: str | None
    headers: list[Header]
    truncated: bool = False  # key or value longer than the console shows: cut at MAX_VALUE_BYTES


@dataclass(frozen=True, slots=True)
class MessagePage:
    topic: str
    partition: int
    start: int  # the offset the page begins at (for a timestamp, the first record at or after it)
    messages: list[Message]
    latest: int


@dataclass(frozen=True, slots=True)
class Produced:
    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class GroupSummary:
    group_id: str
    state: str
    type: str
    members: int


@dataclass(frozen=True, slots=True)
class Member:
    member_id: str
    client_id: str
    host: str
    instance_id: str | None
    assignment: list[str]  # "topic-partition"


@dataclass(frozen=True, slots=True)
class PartitionLag:
    topic: str
    partition: int
    committed: int | None
    latest: int | None  # None: the partition did not answer (no leader, or its topic is gone)
    lag: int | None


@dataclass(frozen=True, slots=True)
class GroupDetail:
    group_id: str
    state: str
    type: str
    protocol: str
    coordinator: int
    members: list[Member]
    offsets: list[PartitionLag] = field(default_factory=list)
    total_lag: int = 0  # the offsets' lags summed (partitions whose latest offset is unknown count 0)


@dataclass(frozen=True, slots=True)
class ScramCredential:
    mechanism: str  # SCRAM-SHA-256 or SCRAM-SHA-512
    iterations: int


@dataclass(frozen=True, slots=True)
class ScramUser:
    name: str
    credentials: list[ScramCredential]


@dataclass(frozen=True, slots=True, order=True)
class AclEntry:
    """One ACL binding, in Kafka's words (kafka-acls): resource type TOPIC, GROUP, CLUSTER or TRANSACTIONAL_ID;
    pattern LITERAL or PREFIXED; operation READ, WRITE, ...; permission ALLOW or DENY."""

    resource_type: str
    resource_name: str
    pattern_type: str
    principal: str
    host: str
    operation: str
    permission: str


@dataclass(frozen=True, slots=True)
class PlannedMove:
    """A partition's move (topic and partition) or a group slot's (group_slot), from shard to shard."""

    topic: str | None
    partition: int | None
    group_slot: int | None
    source: int
    target: int
    moved: bool
    seconds: float


class Placement(Protocol):
    """What only the controller can do (kafscale.actors.controller): planned moves; and how a topic is stored,
    which no API librdkafka speaks tells (it has no DescribeLogDirs, and the physical partitions are Kafscale's)."""

    async def move(self, topic: str, partition: int, target: int) -> dict[str, Any]: ...

    async def drain(self, node: str) -> list[dict[str, Any]]: ...

    async def topic_storage(self, topic: str) -> TopicStorage: ...


class ClusterView(Protocol):
    async def overview(self) -> dict[str, Any]: ...

    async def topics(self) -> list[TopicSummary]: ...

    async def topic(self, name: str) -> TopicDetail: ...

    async def create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> None: ...

    async def alter_topic_configs(self, name: str, set_configs: dict[str, str], delete: list[str]) -> None: ...

    async def delete_topic(self, name: str) -> None: ...

    async def messages(self, topic: str, partition: int, *, offset: int | None, timestamp: int | None,
                       limit: int) -> MessagePage: ...

    async def produce(self, topic: str, partition: int | None, key: bytes | None, value: bytes | None,
                      headers: list[tuple[str, bytes]]) -> Produced: ...

    async def groups(self) -> list[GroupSummary]: ...

    async def group(self, group_id: str) -> GroupDetail: ...

    async def reset_offsets(self, group_id: str, topic: str, to: ResetTo, value: int | None) -> list[PartitionLag]: ...

    async def delete_group(self, group_id: str) -> None: ...

    async def users(self) -> list[ScramUser]: ...

    async def upsert_user(self, name: str, mechanism: str, password: str, iterations: int) -> None: ...

    async def delete_user(self, name: str, mechanism: str) -> None: ...

    async def acls(self) -> list[AclEntry]: ...

    async def create_acl(self, entry: AclEntry) -> None: ...

    async def delete_acl(self, entry: AclEntry) -> int: ...

    async def move_partition(self, topic: str, partition: int, target: int) -> PlannedMove: ...

    async def drain_node(self, node: str) -> list[PlannedMove]: ...

    def close(self) -> None: ...
