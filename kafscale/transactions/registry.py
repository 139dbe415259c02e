"""The transaction coordinators one shard hosts: which ids are its own, loading and recovery, timeouts, expiry.

A transactional id is coordinated by the shard that coordinates a group of the same name
(`placement.coordinator_of`, the same 64 slots: docs/architecture.md), as Kafka hashes both onto their internal
topics' partitions. Requests for other ids get NOT_COORDINATOR and the client asks FindCoordinator again.

At start, and when slots move here, the shard reads every stored transaction it now coordinates (as a Kafka
broker loads its __transaction_state partitions) and ends the prepared ones: a coordinator that died between
PrepareCommit and the markers has its commit finished wherever its slot is served next. A background loop
aborts transactions open longer than their timeout (bumping the epoch, so their producer is fenced) and forgets
ids idle for transactional_id_expiration_ms.

The methods the request handlers call answer with Kafka error codes; they never raise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any
from urllib.parse import unquote

from kafscale.cluster import keys
from kafscale.config import BrokerConfig
from kafscale.protocol.errors import ErrorCode
from kafscale.storage.metadata_store import MetadataStore, MetadataStoreError
from kafscale.transactions import state as rules
from kafscale.transactions.coordinator import (
    Callbacks,
    EndResult,
    Fenced,
    InitResult,
    TxnCoordinator,
    TxnSettings,
    now_ms,
)
from kafscale.transactions.markers import CompleteOffsets, TopicLookup, WriteMarker
from kafscale.transactions.state import TopicPartition, TxnMetadata

__all__ = ["InitResult", "TransactionRegistry", "TxnSettings", "txn_settings"]

log = logging.getLogger(__name__)


class TransactionRegistry:
    def __init__(self, shard_id: int, meta: MetadataStore, settings: TxnSettings, *, owns: Callable[[str], bool],
                 allocate_producer_id: Callable[[], Awaitable[int]], write_marker: WriteMarker,
                 complete_offsets: CompleteOffsets, topic: TopicLookup | None = None) -> None:
        self.shard_id = shard_id
        self.meta = meta
        self.settings = settings
        self.owns = owns  # is this shard the coordinator of a transactional id?
        self.coordinator = TxnCoordinator(meta, settings, Callbacks(allocate_producer_id, write_marker,
                                                                    complete_offsets, topic))
        self._tasks: list[asyncio.Task[None]] = []
        self.loaded = asyncio.Event()  # the start-up load is done
        self.closed = False

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._load_all()), loop.create_task(self._timer_loop())]

    async def close(self) -> None:
        """Stop: nothing more is written. Transactions being ended stay prepared in the store; the next
        coordinator of their slot ends them."""
        self.closed = self.coordinator.closed = True
        tasks: list[asyncio.Task[Any]] = list(self._tasks)
        tasks += [e.finisher for e in self.coordinator.entries.values() if e.finisher is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.coordinator.entries.clear()

    def placement_changed(self) -> None:
        """Ids that moved away are forgotten (their next coordinator reads them; if they come back, this shard
        reads them again as a new incarnation); stored transactions of slots that moved here are loaded."""
        if self.closed:
            return
        self._forget(lambda tid: not self.owns(tid))
        self._spawn(self._load_all())

    async def release_all(self) -> None:
        """This shard stops serving (its lease may lapse): forget every id, stop ending transactions."""
        self._forget(lambda _tid: True)

    def _forget(self, which: Callable[[str], bool]) -> None:
        for tid, entry in list(self.coordinator.entries.items()):
            if which(tid):
                entry.loaded = False
                if entry.finisher is not None:
                    entry.finisher.cancel()

    def _spawn(self, job: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(job)
        self._tasks.append(task)
        task.add_done_callback(self._tasks.remove)

    # ---------------------------------------------------------------- requests

    def check(self, transactional_id: str) -> ErrorCode:
        """The error a request for this id gets before anything else is looked at."""
        if self.closed:
            return ErrorCode.coordinator_not_available
        if not self.owns(transactional_id):
            return ErrorCode.not_coordinator
        return ErrorCode.none

    async def init_producer_id(self, transactional_id: str, transaction_timeout_ms: int, producer_id: int = -1,
                               producer_epoch: int = -1) -> InitResult:
        """InitProducerId with a transactional id. PRODUCER_FENCED is for v4+ (the handler maps it for older
        versions). producer_id/epoch -1: no KIP-360 expectation."""
        if not transactional_id:
            return InitResult(ErrorCode.invalid_request)
        if (producer_id == -1) != (producer_epoch == -1):
            return InitResult(ErrorCode.invalid_request)
        if not rules.valid_timeout(transaction_timeout_ms, self.settings.max_timeout_ms):
            return InitResult(ErrorCode.invalid_transaction_timeout)
        expected = (producer_id, producer_epoch) if producer_id != -1 else None
        result = await self._guarded(transactional_id, lambda: self.coordinator.init_producer_id(
            transactional_id, transaction_timeout_ms, expected))
        return result if isinstance(result, InitResult) else InitResult(result)

    async def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                             partitions: list[TopicPartition]) -> ErrorCode:
        """AddPartitionsToTxn (partitions already checked to exist and be writable): one code for all."""
        if not transactional_id:
            return ErrorCode.invalid_request
        return await self._code(transactional_id, lambda: self.coordinator.add(
            transactional_id, producer_id, producer_epoch, partitions=frozenset(partitions)))

    async def verify_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                                partitions: list[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
        """AddPartitionsToTxn v4+ verify_only (KIP-890): NONE for each partition in the open transaction."""
        if not transactional_id:
            return dict.fromkeys(partitions, ErrorCode.invalid_request)
        result = await self._guarded(transactional_id, lambda: self.coordinator.verify(
            transactional_id, producer_id, producer_epoch, partitions))
        return result if isinstance(result, dict) else dict.fromkeys(partitions, result)

    async def verify_group(self, transactional_id: str, producer_id: int, producer_epoch: int,
                           group_id: str) -> ErrorCode:
        """TxnOffsetCommit's check (KIP-890): NONE when AddOffsetsToTxn put the group in the open transaction."""
        if not transactional_id:
            return ErrorCode.invalid_request
        return await self._code(transactional_id, lambda: self.coordinator.verify_group(
            transactional_id, producer_id, producer_epoch, group_id))

    async def add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int,
                          group_id: str) -> ErrorCode:
        """AddOffsetsToTxn: the group's TxnOffsetCommit offsets become part of the transaction."""
        if not transactional_id:
            return ErrorCode.invalid_request
        return await self._code(transactional_id, lambda: self.coordinator.add(
            transactional_id, producer_id, producer_epoch, groups=frozenset((group_id,))))

    async def verify_or_add(self, transactional_id: str, producer_id: int, producer_epoch: int,
                            partitions: list[TopicPartition], group_id: str | None, add: bool) -> list[int]:
        """What a partition's owner (or a group's coordinator) asks before it takes transactional data: one code per
        partition, then one for the group if given. `add` (transactions v2) puts them in the open transaction;
        otherwise they must be in it already (KIP-890's verification)."""
        if add:
            out = [int(await self.add_partitions(transactional_id, producer_id, producer_epoch, partitions))
                   ] * len(partitions) if partitions else []
            if group_id is not None:
                out.append(int(await self.add_offsets(transactional_id, producer_id, producer_epoch, group_id)))
            return out
        codes = await self.verify_partitions(transactional_id, producer_id, producer_epoch, partitions)
        out = [int(codes[tp]) for tp in partitions]
        if group_id is not None:
            out.append(int(await self.verify_group(transactional_id, producer_id, producer_epoch, group_id)))
        return out

    async def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool,
                      v2: bool = False) -> EndResult:
        """EndTxn: answers once every marker and every group's offsets are durable. v2: EndTxn v5+ (transactions
        v2), which bumps the producer's epoch."""
        if not transactional_id:
            return EndResult(ErrorCode.invalid_request)
        result = await self._guarded(transactional_id, lambda: self.coordinator.end_txn(
            transactional_id, producer_id, producer_epoch, commit, v2))
        return result if isinstance(result, EndResult) else EndResult(result)

    async def describe(self, transactional_id: str) -> tuple[ErrorCode, TxnMetadata | None]:
        """DescribeTransactions: the id's current metadata (None: no such id)."""
        async def read() -> TxnMetadata | None:
            entry = self.coordinator.entry(transactional_id)
            async with entry.lock:
                await self.coordinator.ensure(entry)
                return entry.meta
        result = await self._guarded(transactional_id, read)
        return (ErrorCode.none, result) if not isinstance(result, ErrorCode) else (result, None)

    async def transactions(self) -> list[TxnMetadata]:
        """ListTransactions: every id this shard coordinates (after the start-up load)."""
        await self.loaded.wait()
        return [e.meta for tid, e in list(self.coordinator.entries.items())
                if e.loaded and e.meta is not None and self.owns(tid)]

    async def _code(self, transactional_id: str, call: Callable[[], Awaitable[ErrorCode]]) -> ErrorCode:
        result = await self._guarded(transactional_id, call)
        assert isinstance(result, ErrorCode)
        return result

    async def _guarded(self, transactional_id: str, call: Callable[[], Awaitable[Any]]) -> Any:
        """Run a request against the id's coordinator: store failures and fencing become error codes."""
        error = self.check(transactional_id)
        if error != ErrorCode.none:
            return error
        try:
            result = await call()
        except Fenced:
            log.info("transactional id %s: written by another coordinator incarnation", transactional_id)
            return ErrorCode.not_coordinator
        except MetadataStoreError as e:
            log.warning("transactional id %s: metadata store: %s", transactional_id, e)
            return ErrorCode.coordinator_not_available
        if self.closed or not self.owns(transactional_id):  # moved meanwhile: its write was fenced or is void
            return ErrorCode.not_coordinator
        return result

    # ---------------------------------------------------------------- loading, timeouts, expiry

    async def _load_all(self) -> None:
        """Every stored transaction this shard coordinates, read; the prepared ones are ended (ensure does)."""
        try:
            for kv in await self.meta.range(keys.TRANSACTIONS):
                tid = unquote(kv.key[len(keys.TRANSACTIONS):])
                if self.closed:
                    return
                if not self.owns(tid):
                    continue
                entry = self.coordinator.entry(tid)
                try:
                    async with entry.lock:
                        await self.coordinator.ensure(entry)
                except MetadataStoreError as e:
                    log.warning("transactional id %s not loaded (loads on first use): %s", tid, e)
        except MetadataStoreError as e:
            log.warning("stored transactions not loaded (each loads on first use): %s", e)
        finally:
            self.loaded.set()

    async def _timer_loop(self) -> None:
        await self.loaded.wait()
        since_rescan = 0.0
        while True:
            await asyncio.sleep(self.settings.abort_check_interval_s)
            now = now_ms()
            await self.abort_timed_out(now)
            await self.expire(now)
            since_rescan += self.settings.abort_check_interval_s
            if since_rescan >= self.settings.rescan_interval_s:  # slots that moved here without a notice
                since_rescan = 0.0
                self._forget(lambda tid: not self.owns(tid))
                await self._load_all()

    async def abort_timed_out(self, now: int) -> list[str]:
        """Abort (fencing the producer) every open transaction past its timeout; returns their ids. The markers
        go in the background."""
        aborted = []
        for tid, entry in list(self.coordinator.entries.items()):
            if self.closed or not self.owns(tid) or entry.meta is None or not rules.timed_out(entry.meta, now):
                continue
            with contextlib.suppress(Fenced, MetadataStoreError):
                async with entry.lock:
                    await self.coordinator.ensure(entry)
                    if entry.meta is not None and rules.timed_out(entry.meta, now):
                        log.info("transactional id %s: transaction of producer %d epoch %d timed out; aborting",
                                 tid, entry.meta.producer_id, entry.meta.producer_epoch)
                        await self.coordinator.write(entry, rules.fence_and_abort(entry.meta, now))
                        self.coordinator.finish(entry)
                        aborted.append(tid)
        return aborted

    async def expire(self, now: int) -> list[str]:
        """Forget ids idle (no transaction open or ending) for transactional_id_expiration_ms."""
        expired = []
        for tid, entry in list(self.coordinator.entries.items()):
            if self.closed:
                break
            ttl = self.settings.id_expiration_ms
            if self.owns(tid) and entry.meta is not None and rules.expired(entry.meta, now, ttl):
                with contextlib.suppress(Fenced, MetadataStoreError):
                    async with entry.lock:
                        await self.coordinator.ensure(entry)
                        if entry.meta is not None and rules.expired(entry.meta, now, ttl):
                            await self.coordinator.delete(entry)
                            log.info("transactional id %s expired", tid)
                            expired.append(tid)
            # drop what holds nothing (no record, nobody waiting: the lock is free, checked without yielding)
            if (not self.owns(tid) or (entry.loaded and entry.meta is None)) and not entry.lock.locked() and (
                    entry.finisher is None or entry.finisher.done()):
                self.coordinator.entries.pop(tid, None)
        return expired


def txn_settings(config: BrokerConfig) -> TxnSettings:
    return TxnSettings(max_timeout_ms=config.transaction_max_timeout_ms,
                       id_expiration_ms=config.transactional_id_expiration_ms)
