"""A small Broker for handler unit tests: no socket, no Ray, no object store.

Topics and groups are the real registries over an embedded metadata store in a temporary directory (a SQLite
file, not a server); partitions are in-memory lists of record batches. Handlers in kafscale.acceptor.handlers see
exactly the `Broker` protocol of kafscale.broker.interface, so whatever they do here they do in a shard.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from kafscale.acceptor.router import RequestContext
from kafscale.broker.fetch_sessions import FetchSessionCache
from kafscale.broker.interface import FetchItem, ProduceItem
from kafscale.broker.results import (
    DeleteRecordsResult,
    FetchResult,
    GroupOffsets,
    OffsetResult,
    PartitionLag,
    ProduceResult,
)
from kafscale.broker.txn_admin import ActiveProducer, PartitionProducers
from kafscale.cluster.placement import Placement, ShardAddress
from kafscale.cluster.topics import TopicRegistry
from kafscale.config import BrokerConfig
from kafscale.groups.registry import GroupRegistry, group_settings
from kafscale.protocol.errors import ErrorCode
from kafscale.security.acls import Acls
from kafscale.security.credentials import Credentials
from kafscale.storage.batch import set_base_offset, split_batches
from kafscale.storage.control import TxnMarker
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.transactions.registry import TransactionRegistry, txn_settings

T = TypeVar("T")


@dataclass
class Log:
    log_start: int = 0
    batches: list[tuple[int, int, bytes]] = field(default_factory=list)  # (base offset, last offset, bytes)

    @property
    def end(self) -> int:
        return self.batches[-1][1] + 1 if self.batches else self.log_start


class FakeBroker:
    def __init__(self, meta: EmbeddedStore, *, shard_id: int = 0, shards: int = 1,
                 config: BrokerConfig | None = None) -> None:
        self.shard_id = shard_id
        self.config = config or BrokerConfig()
        self.cluster_id = "fake-cluster"
        self.placement = Placement(shard_id, [ShardAddress(i, "127.0.0.1", 9092 + i) for i in range(shards)])
        self.topics = TopicRegistry(meta)
        self.credentials = Credentials(meta)
        self.acls = Acls(meta, enabled=False)  # no authorizer: every request is allowed
        self.groups = GroupRegistry(shard_id, meta, group_settings(self.config), owns=self.placement.coordinates,
                                    offsets_retention_ms=self.config.offsets_retention_minutes * 60_000,
                                    retention_check_interval_s=3600, topic=self.topics.get)
        self.logs: dict[tuple[str, int], Log] = {}
        self.flushed_now: list[tuple[str, int]] = []  # the partitions flush_now was asked for, in order
        self.fetch_sessions = FetchSessionCache(self.config.max_incremental_fetch_session_cache_slots)
        self._next_producer_id = 1000
        # Transactions (docs/transactions.md): markers go into the fake logs, offsets to the real group registry
        self.transactions = TransactionRegistry(shard_id, meta, txn_settings(self.config),
                                                owns=self.placement.coordinates,
                                                allocate_producer_id=self.allocate_producer_id,
                                                write_marker=self.write_txn_marker,
                                                complete_offsets=self.complete_txn_offsets, topic=self.topics.get)
        self.markers: list[tuple[str, int, TxnMarker]] = []  # every marker written, in order
        self.producers: dict[tuple[str, int], list[ActiveProducer]] = {}  # what DescribeProducers answers

    def _log(self, topic: str, partition: int) -> Log | None:
        info = self.topics.topics.get(topic)
        if info is None or not 0 <= partition < info.partitions:
            return None
        return self.logs.setdefault((topic, partition), Log())

    def _led_elsewhere(self, topic: str, partition: int) -> bool:
        """A partition another shard leads: the fake forwards nothing, it answers NOT_LEADER_OR_FOLLOWER."""
        info = self.topics.topics.get(topic)
        return info is not None and 0 <= partition < info.partitions and not self.placement.leads(info, partition)

    def flush_now(self, partitions: Iterable[tuple[str, int]], producer_id: int) -> None:
        self.flushed_now.extend(partitions)  # the fake's writes are durable at once: only recorded

    def start_produce(self, items: list[ProduceItem], acks: int, timeout_ms: int,
                      then: Callable[[list[ProduceResult]], T],
                      transactional_id: str | None = None, add_to_txn: bool = False) -> asyncio.Future[T]:
        results = []
        for topic, partition, records in items:
            log = self._log(topic, partition)
            if self._led_elsewhere(topic, partition):
                results.append(ProduceResult(int(ErrorCode.not_leader_or_follower)))
                continue
            if log is None:
                results.append(ProduceResult(int(ErrorCode.unknown_topic_or_partition)))
                continue
            base = log.end
            for pos, header in split_batches(records):
                set_base_offset(records, pos, log.end)
                log.batches.append((log.end, log.end + header.last_offset_delta, bytes(records[pos:pos + header.size])))
            results.append(ProduceResult(0, base, -1, log.log_start))
        done: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        done.set_result(then(results))
        return done

    async def produce(self, topic: str, partition: int, records: bytes | bytearray, acks: int,
                      timeout_ms: int) -> ProduceResult:
        return (await self.start_produce([(topic, partition, bytearray(records))], acks, timeout_ms, list))[0]

    async def fetch(self, parts: list[FetchItem], max_wait_ms: int, min_bytes: int, max_bytes: int,
                    isolation_level: int = 0) -> list[FetchResult]:
        results = []
        for topic, partition, offset, _ in parts:
            log = self._log(topic, partition)
            if self._led_elsewhere(topic, partition):
                results.append(FetchResult(int(ErrorCode.not_leader_or_follower)))
            elif log is None:
                results.append(FetchResult(int(ErrorCode.unknown_topic_or_partition)))
            elif not log.log_start <= offset <= log.end:
                results.append(FetchResult(int(ErrorCode.offset_out_of_range), log.end, log.log_start))
            else:
                data = b"".join(b for _, last, b in log.batches if last >= offset)
                results.append(FetchResult(0, log.end, log.log_start, data))
        return results

    async def list_offset(self, topic: str, partition: int, timestamp: int,
                          isolation_level: int = 0) -> OffsetResult:
        log = self._log(topic, partition)
        if log is None:
            return OffsetResult(int(ErrorCode.unknown_topic_or_partition))
        return OffsetResult(0, log.log_start if timestamp == -2 else log.end)

    async def delete_records(self, topic: str, partition: int, offset: int) -> DeleteRecordsResult:
        log = self._log(topic, partition)
        if log is None:
            return DeleteRecordsResult(int(ErrorCode.unknown_topic_or_partition))
        target = log.end if offset == -1 else offset
        if not 0 <= target <= log.end:
            return DeleteRecordsResult(int(ErrorCode.offset_out_of_range))
        log.log_start = max(log.log_start, target)
        log.batches = [b for b in log.batches if b[1] >= log.log_start]
        return DeleteRecordsResult(0, log.log_start)

    async def delete_topic(self, name: str) -> bool:
        return await self.topics.delete(name)

    async def describe_producers(self, topic: str, partition: int) -> PartitionProducers:
        if self._led_elsewhere(topic, partition):
            return PartitionProducers(int(ErrorCode.not_leader_or_follower))
        if self._log(topic, partition) is None:
            return PartitionProducers(int(ErrorCode.unknown_topic_or_partition))
        return PartitionProducers(0, list(self.producers.get((topic, partition), [])))

    async def allocate_producer_id(self) -> int:
        self._next_producer_id += 1
        return self._next_producer_id - 1

    async def write_txn_marker(self, topic: str, partition: int, marker: TxnMarker, timeout_ms: int) -> int:
        if self._log(topic, partition) is None:
            return int(ErrorCode.unknown_topic_or_partition)
        self.markers.append((topic, partition, marker))
        return (await self.produce(topic, partition, marker.batch(0), -1, timeout_ms)).error

    async def verify_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                         partitions: list[tuple[str, int]], group_id: str | None = None,
                         add: bool = False) -> list[int]:
        return await self.transactions.verify_or_add(transactional_id, producer_id, producer_epoch, partitions,
                                                     group_id, add)

    async def complete_txn_offsets(self, group_id: str, producer_id: int, producer_epoch: int, commit: bool) -> int:
        return int(await self.groups.complete_txn_offsets(group_id, producer_id, producer_epoch, commit))

    async def group_lag(self, group_id: str) -> list[PartitionLag]:
        return []

    async def group_offsets(self, group_id: str, forwarded: bool = False) -> GroupOffsets:
        error, coordinator = await self.groups.lookup(group_id)
        if error != ErrorCode.none:
            return GroupOffsets(error)
        return GroupOffsets(ErrorCode.none, await self.groups.live_offsets(coordinator))


@contextlib.asynccontextmanager
async def fake_broker(tmp_path: Path, **kwargs: Any) -> AsyncIterator[FakeBroker]:
    meta = EmbeddedStore(tmp_path / "metadata.db")
    broker = FakeBroker(meta, **kwargs)
    await broker.topics.start()
    await broker.groups.start()
    await broker.transactions.start()
    try:
        yield broker
    finally:
        await broker.transactions.close()
        await broker.groups.close()
        await broker.topics.stop()
        await meta.close()


def context(api_key: int, version: int, correlation_id: int = 7) -> RequestContext:
    """What the listener hands a handler, for a request that came from nowhere."""
    listener = SimpleNamespace(name="PLAINTEXT")  # what handlers read of the listener a request came in on
    return RequestContext(api_key, version, correlation_id, "unit-test", "127.0.0.1", 1, 1, listener)  # type: ignore[arg-type]


def record_batch(*values: bytes) -> bytearray:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i, value in enumerate(values):
        builder.append(i, timestamp=1, key=None, value=value, headers=[])
    return bytearray(builder.build())
