"""The broker boundary: everything the Kafka front end (kafscale.acceptor) may ask of a shard's core.

Handlers take a `Broker` and nothing else; `ShardCore` is the real one, and tests use a small fake. A `Peer`
is another shard as the core calls it when a partition or group lives there: the same calls with the same
typed results, carried by Ray (kafscale.actors.shard_actor) or made in process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar

from kafscale.broker.fetch_sessions import FetchSessionCache
from kafscale.broker.log_dirs import LogDir, Wanted
from kafscale.broker.results import (
    DeleteRecordsResult,
    FetchResult,
    GroupOffsets,
    OffsetResult,
    PartitionLag,
    ProduceResult,
)
from kafscale.broker.txn_admin import PartitionProducers
from kafscale.cluster.placement import Placement
from kafscale.cluster.topics import TopicRegistry
from kafscale.config import BrokerConfig
from kafscale.groups.registry import GroupRegistry
from kafscale.security.acls import Acls
from kafscale.security.credentials import Credentials
from kafscale.storage.control import TxnMarker
from kafscale.transactions.registry import TransactionRegistry

T = TypeVar("T")

ProduceItem = tuple[str, int, bytearray]  # topic, partition, record batches (taken over by the owner)
FetchItem = tuple[str, int, int, int]  # topic, partition, fetch offset, partition max bytes


class Peer(Protocol):
    """Partition and group calls that go to the shard that owns the partition or group."""

    async def produce(self, topic: str, partition: int, records: bytes | bytearray, acks: int,
                      timeout_ms: int) -> ProduceResult: ...

    async def fetch(self, parts: list[FetchItem], max_wait_ms: int, min_bytes: int, max_bytes: int,
                    isolation_level: int = 0) -> list[FetchResult]: ...

    async def list_offset(self, topic: str, partition: int, timestamp: int,
                          isolation_level: int = 0) -> OffsetResult: ...

    async def write_txn_marker(self, topic: str, partition: int, marker: TxnMarker, timeout_ms: int) -> int:
        """A transaction coordinator's marker, appended to the partition and durable before the answer (a Kafka
        error code: 0 when written)."""
        ...

    async def verify_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                         partitions: list[tuple[str, int]], group_id: str | None = None,
                         add: bool = False) -> list[int]:
        """KIP-890's check at the transaction's coordinator, before a transactional batch opens a transaction in a
        partition or a TxnOffsetCommit is taken: one Kafka error code per partition, then one for the group if
        named (0: part of the producer's open transaction). add (transactions v2: Produce v12+, TxnOffsetCommit
        v5+): the coordinator adds them to the transaction, as AddPartitionsToTxn and AddOffsetsToTxn would."""
        ...

    async def complete_txn_offsets(self, group_id: str, producer_id: int, producer_epoch: int, commit: bool) -> int:
        """A transaction's end at the group coordinator: its pending TxnOffsetCommit offsets become the group's
        committed offsets (commit) or are dropped (abort). A Kafka error code."""
        ...

    async def describe_producers(self, topic: str, partition: int) -> PartitionProducers:
        """DescribeProducers of one partition, at its owner: the producers its producer state holds."""
        ...

    async def delete_records(self, topic: str, partition: int, offset: int) -> DeleteRecordsResult: ...

    async def group_lag(self, group_id: str) -> list[PartitionLag]: ...

    async def group_offsets(self, group_id: str, forwarded: bool = False) -> GroupOffsets: ...


Peers = Callable[[int], Peer]  # shard id -> that shard


class Broker(Peer, Protocol):
    """A shard's core as its request handlers see it."""

    shard_id: int
    config: BrokerConfig
    cluster_id: str
    placement: Placement  # who leads each partition and coordinates each group
    topics: TopicRegistry  # the topics as the metadata store holds them (watched)
    groups: GroupRegistry  # the group coordinators this shard hosts
    acls: Acls  # ACL bindings and the authorizer over them (its `authorizer` is None when none is configured)
    credentials: Credentials  # users' SCRAM credentials (SASL checks them; the SCRAM admin APIs manage them)
    transactions: TransactionRegistry  # the transaction coordinators this shard hosts
    fetch_sessions: FetchSessionCache  # the incremental fetch sessions (KIP-227) of this shard's consumers

    def start_produce(self, items: list[ProduceItem], acks: int, timeout_ms: int,
                      then: Callable[[list[ProduceResult]], T],
                      transactional_id: str | None = None, add_to_txn: bool = False) -> asyncio.Future[T]:
        """One Produce request's partitions: a future of then(results), results in request order. A transactional
        producer's batches that would open a transaction in a partition are first checked with its coordinator
        (add_to_txn, Produce v12+: added to the transaction by it)."""
        ...

    def flush_now(self, partitions: Iterable[tuple[str, int]], producer_id: int) -> None:
        """The producer (-1: a plain one) waiting on these partitions (led here) can send nothing more until
        answered: flush what it waits for without waiting for the flush interval."""
        ...

    async def delete_topic(self, name: str) -> bool:
        """Remove the topic's metadata (clients stop seeing it), then its objects. False: no such topic."""
        ...

    async def allocate_producer_id(self) -> int:
        """A producer id never handed out before."""
        ...

    async def log_dir(self, wanted: Wanted | None) -> LogDir:
        """DescribeLogDirs: the partitions this shard leads among `wanted` (None: all), with their sizes."""
        ...
