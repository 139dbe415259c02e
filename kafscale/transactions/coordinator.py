"""The transaction coordinator's requests for one transactional id at a time, over the metadata store.

Each transactional id has one record, `transactions/{tid}` (kafscale.cluster.keys), the equivalent of its
entry in Kafka's __transaction_state. This module keeps a cached copy per id (`TxnEntry`) with the record's
mod_revision as this incarnation last read or wrote it; every write is a transaction that compares that
revision, so a coordinator that another incarnation (a shard the slot moved to, or a restart) has overtaken
cannot write: its write fails, it forgets its copy (the next request reads the record again, as a new
incarnation) and the request is answered NOT_COORDINATOR.

The coordinator epoch the markers carry is the record's `coordinator_epoch`: an incarnation writes the stored
one plus one, so a later incarnation's markers always carry a higher epoch than an earlier one's.

Requests for one id run one at a time (`TxnEntry.lock`), but the lock is not held while markers are written:
then the id is in Prepare*, other requests answer CONCURRENT_TRANSACTIONS (as Kafka's do) and the client
retries. EndTxn waits for its markers (the issue: markers durable before EndTxn answers); InitProducerId waits
for them a bounded time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kafscale.cluster import keys
from kafscale.protocol.errors import ErrorCode
from kafscale.storage.backoff import Backoff
from kafscale.storage.metadata_store import Compare, Delete, MetadataStore, MetadataStoreError, Put
from kafscale.transactions import state as rules
from kafscale.transactions.markers import CompleteOffsets, Completion, TopicLookup, WriteMarker, end_everywhere
from kafscale.transactions.state import TxnMetadata

log = logging.getLogger(__name__)


class Fenced(Exception):
    """Another coordinator incarnation wrote the transactional id's record since this one read it."""


@dataclass(frozen=True, slots=True)
class TxnSettings:
    max_timeout_ms: int = 900_000  # transaction.max.timeout.ms
    id_expiration_ms: int = 604_800_000  # transactional.id.expiration.ms
    abort_check_interval_s: float = 10.0  # Kafka's transaction.abort.timed.out.transaction.cleanup.interval.ms
    rescan_interval_s: float = 60.0  # stored transactions of slots that moved here are picked up this often
    busy_wait_s: float = 5.0  # InitProducerId waits this long for markers in flight, then CONCURRENT_TRANSACTIONS
    marker_timeout_ms: int = 30_000
    backoff_first_s: float = 0.05
    backoff_cap_s: float = 2.0


@dataclass(frozen=True, slots=True)
class InitResult:
    error: ErrorCode
    producer_id: int = -1
    producer_epoch: int = -1


@dataclass(frozen=True, slots=True)
class EndResult:
    """EndTxn's answer; v5+ (transactions v2) also tells the producer the id and epoch it goes on with."""

    error: ErrorCode
    producer_id: int = -1
    producer_epoch: int = -1


@dataclass(frozen=True, slots=True)
class Callbacks:
    """What the coordinator needs from its broker (the transactions package sits below it)."""

    allocate_producer_id: Callable[[], Awaitable[int]]
    write_marker: WriteMarker
    complete_offsets: CompleteOffsets
    topic: TopicLookup | None = None


class TxnEntry:
    """This incarnation's copy of one transactional id's record."""

    __slots__ = ("epoch", "finisher", "loaded", "lock", "meta", "revision", "transactional_id")

    def __init__(self, transactional_id: str) -> None:
        self.transactional_id = transactional_id
        self.lock = asyncio.Lock()
        self.loaded = False  # False: read the record before trusting meta (first use, or after a failed write)
        self.meta: TxnMetadata | None = None  # None: no record
        self.revision = 0  # the record's mod_revision as last read or written here (0: absent)
        self.epoch = 0  # the coordinator epoch this incarnation writes
        self.finisher: asyncio.Task[bool] | None = None  # markers of a Prepare* in flight


def now_ms() -> int:
    return int(time.time() * 1000)


class TxnCoordinator:
    def __init__(self, meta: MetadataStore, settings: TxnSettings, callbacks: Callbacks) -> None:
        self.meta = meta
        self.settings = settings
        self.callbacks = callbacks
        self.entries: dict[str, TxnEntry] = {}
        self.closed = False

    def entry(self, transactional_id: str) -> TxnEntry:
        found = self.entries.get(transactional_id)
        if found is None:
            found = self.entries[transactional_id] = TxnEntry(transactional_id)
        return found

    # ---------------------------------------------------------------- the record: fenced reads and writes

    async def ensure(self, entry: TxnEntry) -> None:
        """Read the record unless this incarnation's copy is current (call with the entry's lock held). A record
        found in Prepare* gets its markers sent: whoever wrote it may have died before sending them."""
        if entry.loaded:
            return
        kv = await self.meta.get(keys.transaction(entry.transactional_id))
        entry.meta = TxnMetadata.from_dict(entry.transactional_id, kv.value) if kv is not None else None
        entry.revision = kv.mod_revision if kv is not None else 0
        entry.epoch = entry.meta.coordinator_epoch + 1 if entry.meta is not None else 0
        entry.loaded = True
        if entry.meta is not None and entry.meta.state.preparing:
            self.finish(entry)

    async def write(self, entry: TxnEntry, new: TxnMetadata) -> None:
        """Durably replace the record, only if nobody wrote it since this incarnation did (lock held)."""
        new = new if new.coordinator_epoch == entry.epoch else _with_epoch(new, entry.epoch)
        key = keys.transaction(entry.transactional_id)
        try:
            result = await self.meta.txn([Compare(key, "mod_revision", "==", entry.revision)],
                                         [Put(key, new.to_dict())])
        except MetadataStoreError:
            entry.loaded = False  # the write may or may not have happened: read again before the next one
            raise
        if not result.succeeded:
            entry.loaded = False
            raise Fenced(entry.transactional_id)
        entry.meta, entry.revision = new, result.revision

    async def delete(self, entry: TxnEntry) -> None:
        key = keys.transaction(entry.transactional_id)
        try:
            result = await self.meta.txn([Compare(key, "mod_revision", "==", entry.revision)], [Delete(key)])
        except MetadataStoreError:
            entry.loaded = False
            raise
        if not result.succeeded:
            entry.loaded = False
            raise Fenced(entry.transactional_id)
        entry.meta, entry.revision = None, 0

    async def still_ours(self, entry: TxnEntry) -> bool:
        try:
            kv = await self.meta.get(keys.transaction(entry.transactional_id))
        except MetadataStoreError:
            return True  # cannot tell: keep trying (a fenced write later settles it)
        return kv is not None and kv.mod_revision == entry.revision and not self.closed

    # ---------------------------------------------------------------- InitProducerId

    async def init_producer_id(self, transactional_id: str, timeout_ms: int,
                               expected: tuple[int, int] | None) -> InitResult:
        """Bump the epoch (fencing older producers of the id), aborting a transaction left open first."""
        deadline = asyncio.get_running_loop().time() + self.settings.busy_wait_s
        while True:
            entry = self.entry(transactional_id)
            async with entry.lock:
                await self.ensure(entry)
                meta = entry.meta
                if meta is None:
                    meta = rules.new_metadata(transactional_id, await self.callbacks.allocate_producer_id(),
                                              timeout_ms, now_ms())
                error = rules.check_expected_producer(meta, expected)
                if error != ErrorCode.none:
                    return InitResult(error)
                if meta.state.preparing:
                    waiting = self.finish(entry)
                elif meta.state is rules.TxnState.ONGOING:  # the previous producer's: abort it, then bump
                    log.info("transactional id %s: aborting the open transaction of producer %d epoch %d "
                             "(InitProducerId)", transactional_id, meta.producer_id, meta.producer_epoch)
                    await self.write(entry, rules.fence_and_abort(meta, now_ms()))
                    waiting = self.finish(entry)
                else:
                    if rules.needs_new_producer_id(meta, expected):
                        new: TxnMetadata | ErrorCode = rules.rotate(
                            meta, await self.callbacks.allocate_producer_id(), timeout_ms, now_ms(), expected)
                    else:
                        new = rules.bump_epoch(meta, expected[1] if expected else None, timeout_ms, now_ms())
                    if isinstance(new, ErrorCode):
                        return InitResult(new)
                    await self.write(entry, new)
                    return InitResult(ErrorCode.none, new.producer_id, new.producer_epoch)
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return InitResult(ErrorCode.concurrent_transactions)
            done, _ = await asyncio.wait({waiting}, timeout=remaining)
            if not done:
                return InitResult(ErrorCode.concurrent_transactions)
            if waiting.cancelled() or not waiting.result():  # overtaken, or failed: look again, not in a spin
                await asyncio.sleep(self.settings.backoff_first_s)

    # ---------------------------------------------------------------- AddPartitionsToTxn, AddOffsetsToTxn

    async def add(self, transactional_id: str, producer_id: int, producer_epoch: int, *,
                  partitions: frozenset[rules.TopicPartition] = frozenset(),
                  groups: frozenset[str] = frozenset()) -> ErrorCode:
        """Partitions or a group join the transaction: durable before the answer."""
        entry = self.entry(transactional_id)
        async with entry.lock:
            await self.ensure(entry)
            if entry.meta is None:
                return ErrorCode.invalid_producer_id_mapping
            new = rules.add(entry.meta, producer_id, producer_epoch, now_ms(), partitions=partitions, groups=groups)
            if isinstance(new, ErrorCode):
                return new
            await self.write(entry, new)
            return ErrorCode.none

    async def verify(self, transactional_id: str, producer_id: int, producer_epoch: int,
                     partitions: list[rules.TopicPartition]) -> dict[rules.TopicPartition, ErrorCode]:
        entry = self.entry(transactional_id)
        async with entry.lock:
            await self.ensure(entry)
            return rules.verify(entry.meta, producer_id, producer_epoch, partitions)

    async def verify_group(self, transactional_id: str, producer_id: int, producer_epoch: int,
                           group_id: str) -> ErrorCode:
        entry = self.entry(transactional_id)
        async with entry.lock:
            await self.ensure(entry)
            return rules.verify_group(entry.meta, producer_id, producer_epoch, group_id)

    # ---------------------------------------------------------------- EndTxn, and ending a prepared transaction

    async def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool,
                      v2: bool = False) -> EndResult:
        """Prepare*, then the markers and the groups' offsets, then Complete*: all durable before the answer.
        v2 (EndTxn v5+, transactions v2): the ending bumps the producer's epoch (state.end_v2), and the answer
        carries the producer id and epoch to go on with."""
        entry = self.entry(transactional_id)
        async with entry.lock:
            await self.ensure(entry)
            if entry.meta is None:
                return EndResult(ErrorCode.invalid_producer_id_mapping)
            if v2:
                new = rules.end_v2(entry.meta, producer_id, producer_epoch, commit, now_ms())
                if isinstance(new, TxnMetadata) and rules.needs_next_producer_id(new):
                    new = dataclasses.replace(new, next_producer_id=await self.callbacks.allocate_producer_id())
            else:
                new = rules.end(entry.meta, producer_id, producer_epoch, commit, now_ms())
            if isinstance(new, ErrorCode):
                if new == ErrorCode.concurrent_transactions:
                    self.finish(entry)  # make sure someone is finishing it
                if new == ErrorCode.none and v2:  # a retry of an ending done: what it answered then
                    return EndResult(new, *rules.after_v2(entry.meta))
                return EndResult(new)
            await self.write(entry, new)
            finisher = self.finish(entry)
        await asyncio.wait({finisher})
        if finisher.cancelled() or not finisher.result():
            # stopped (the shard is closing) or overtaken by another incarnation, which finishes it: the
            # client finds the coordinator again and its retry of EndTxn is answered there
            return EndResult(ErrorCode.not_coordinator)
        return EndResult(ErrorCode.none, *rules.after_v2(new)) if v2 else EndResult(ErrorCode.none)

    def finish(self, entry: TxnEntry) -> asyncio.Task[bool]:
        """The task ending the entry's prepared transaction (started unless one is running)."""
        if entry.finisher is None or entry.finisher.done():
            entry.finisher = asyncio.get_running_loop().create_task(self._finish(entry))
        return entry.finisher

    async def _finish(self, entry: TxnEntry) -> bool:
        """Markers, offsets, Complete*; retried while this incarnation runs. True when the transaction is over."""
        try:
            prepared = await self._fenced_step(entry, lambda: self._adopt(entry))
            if prepared is None:
                return entry.meta is not None and not entry.meta.state.preparing
            how = Completion(self.callbacks.write_marker, self.callbacks.complete_offsets, self.callbacks.topic,
                             lambda: self.still_ours(entry), self.settings.marker_timeout_ms,
                             self.settings.backoff_first_s, self.settings.backoff_cap_s)
            if not await end_everywhere(prepared, how):
                log.info("transactional id %s: another coordinator took over while markers were written",
                         entry.transactional_id)
                entry.loaded = False
                return False
            done = await self._fenced_step(entry, lambda: self._complete(entry, prepared))
            return done is not None
        except Fenced:
            log.info("transactional id %s: fenced by another coordinator incarnation", entry.transactional_id)
            return False
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("transactional id %s: ending the transaction failed", entry.transactional_id)
            return False

    async def _fenced_step(self, entry: TxnEntry,
                           step: Callable[[], Awaitable[TxnMetadata | None]]) -> TxnMetadata | None:
        """One write under the entry's lock, retried while the store fails (never given up while running)."""
        backoff = Backoff(self.settings.backoff_first_s, self.settings.backoff_cap_s)
        while not self.closed:
            try:
                async with entry.lock:
                    await self.ensure(entry)
                    return await step()
            except MetadataStoreError as e:
                log.warning("transactional id %s: metadata store: %s; retrying", entry.transactional_id, e)
                await backoff.wait()
        raise asyncio.CancelledError

    async def _adopt(self, entry: TxnEntry) -> TxnMetadata | None:
        """The prepared transaction to end, rewritten first if another incarnation prepared it: the markers
        must carry this incarnation's coordinator epoch, and that epoch must be durable before they go."""
        current = entry.meta
        if current is None or not current.state.preparing:
            return None
        if current.coordinator_epoch != entry.epoch:
            await self.write(entry, current)
        return entry.meta

    async def _complete(self, entry: TxnEntry, prepared: TxnMetadata) -> TxnMetadata | None:
        current = entry.meta
        if current is None or not current.state.preparing or not _same_transaction(current, prepared):
            return current if current is not None and not current.state.preparing else None
        await self.write(entry, rules.complete(current, now_ms()))
        log.debug("transactional id %s: %s", entry.transactional_id, entry.meta.state.value if entry.meta else "")
        return entry.meta


def _with_epoch(meta: TxnMetadata, epoch: int) -> TxnMetadata:
    return dataclasses.replace(meta, coordinator_epoch=epoch)


def _same_transaction(a: TxnMetadata, b: TxnMetadata) -> bool:
    return (a.producer_id, a.producer_epoch, a.state, a.partitions, a.groups) == (
        b.producer_id, b.producer_epoch, b.state, b.partitions, b.groups)
