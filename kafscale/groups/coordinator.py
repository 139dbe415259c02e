"""The group coordinator: the logical actor of one consumer group, hosted by a shard.

`Group` (state.py) decides; this wraps it with what needs a loop and a store: requests waiting for their
answer, one timer task for sessions and barriers, and the writes. Everything touching the group runs under its
lock, so the state machine sees one request at a time. The classic protocol's writes are made under the lock too
(a SyncGroup's assignment is durable before anyone else can change the group). Offset commits and the consumer
protocol's heartbeats change memory under the lock and wait for their write outside it, so that one transaction
carries the writes of many members (batched_writes.py); their answers still go out only once durable.

Fencing: the registry took the group's coordinator key for this incarnation (registry.py); every write
compares that key's revision, so a coordinator that has been replaced cannot write, and stops (NOT_COORDINATOR).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.cluster import keys
from kafscale.groups import txn_offsets
from kafscale.groups.batched_writes import BatchedWrites
from kafscale.groups.consumer.group import ConsumerGroup, ConsumerSettings, Heartbeat, HeartbeatAnswer
from kafscale.groups.consumer.stored import consumer_group_records
from kafscale.groups.offsets import OffsetEntry, TopicPartition, expired_offsets
from kafscale.groups.state import Group, GroupSettings, JoinResult, State, SyncResult
from kafscale.groups.stored import group_records
from kafscale.groups.stored_records import StoredRecords
from kafscale.groups.txn_offsets import PendingOffsets, parse_pending
from kafscale.storage.metadata_store import Compare, Delete, MetadataStore, MetadataStoreError, Op, Put

log = logging.getLogger(__name__)



class CoordinatorFenced(Exception):
    """Another coordinator incarnation took the group over."""


class GroupCoordinator:
    def __init__(self, group: Group | ConsumerGroup, *, meta: MetadataStore, revision: int,
                 offsets: dict[TopicPartition, OffsetEntry], persisted: bool,
                 on_dead: Callable[[GroupCoordinator], None], pending: dict[int, PendingOffsets] | None = None,
                 classic: GroupSettings | None = None, consumer: ConsumerSettings | None = None,
                 stored: dict[str, Any] | None = None) -> None:
        self.group_id = group.group_id
        # Either protocol's group: an empty group of one kind becomes the other when the other protocol joins it.
        self.group: Group | ConsumerGroup = group
        self.classic_settings = classic or GroupSettings()
        self.consumer_settings = consumer or ConsumerSettings()
        self.offsets = offsets
        self.pending = pending or {}  # TxnOffsetCommit offsets of open transactions, by producer id
        self.meta = meta
        self._revision = revision
        self._persisted = persisted  # the group's record exists in the store
        self._records = StoredRecords(stored)  # the group's records (header, members) as last written
        self._on_dead = on_dead
        self._lock = asyncio.Lock()
        self._waiters: dict[int, asyncio.Future[Any]] = {}
        self._tickets = itertools.count(1)
        self._wake = asyncio.Event()
        self._timer: asyncio.Task[None] | None = None
        self._writes = BatchedWrites(self._txn)
        self.closed = False

    def start(self) -> None:
        self._timer = asyncio.get_running_loop().create_task(self._timer_loop())

    async def close(self) -> None:
        """The shard stops: waiting requests are told to find the coordinator again."""
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        self.group.mark_dead()
        self._deliver()

    # ---------------------------------------------------------------- membership

    async def join(self, **request: Any) -> JoinResult:
        async with self._lock:
            if isinstance(self.group, ConsumerGroup):
                if self.group.state is not State.EMPTY:
                    return JoinResult(ErrorCode.inconsistent_group_protocol, request.get("member_id", ""))
                self._convert(Group(self.group_id, self.classic_settings, time.time()))
        return await self._call(self.group.join, request)

    async def sync(self, **request: Any) -> SyncResult:
        if isinstance(self.group, ConsumerGroup):
            return SyncResult(ErrorCode.unknown_member_id)
        return await self._call(self.group.sync, request)

    async def consumer_heartbeat(self, hb: Heartbeat, topics: Mapping[str, int], version: int) -> HeartbeatAnswer:
        """ConsumerGroupHeartbeat: the group's answer, after the change it made is stored."""
        async with self._lock:
            if not isinstance(self.group, ConsumerGroup):
                if self.group.state is State.DEAD:
                    return HeartbeatAnswer(ErrorCode.coordinator_not_available)
                if self.group.state is not State.EMPTY or self.group.pending_members:
                    return HeartbeatAnswer(ErrorCode.group_id_not_found,
                                           f"Group {self.group_id} is not a consumer group.")
                self._convert(ConsumerGroup(self.group_id, self.consumer_settings, time.time()))
            group = self.group
            answer = group.heartbeat(time.time(), hb, topics, version)
            if group.store_requested:
                group.store_requested = False
                stored = self._submit_group([], self._stored)
            elif not self._writes.idle:  # what this answer tells may come from a change not yet durable
                stored = self._writes.written()
            else:
                stored = None
            self._wake.set()  # sessions and revocation deadlines moved
        if stored is None:  # answered without another turn of a busy event loop
            return answer
        error = await self._outcome(stored, "storing the group")
        return answer if error == ErrorCode.none else HeartbeatAnswer(error)

    def _convert(self, group: Group | ConsumerGroup) -> None:
        """An empty group joined through the other protocol becomes a group of that protocol (as Kafka 4 does);
        its committed offsets stay."""
        log.info("group %s: empty %s group becomes a %s group", self.group_id,
                 type(self.group).__name__, type(group).__name__)
        self.group = group

    async def _call(self, method: Callable[..., Any], request: dict[str, Any]) -> Any:
        async with self._lock:
            ticket = next(self._tickets)
            waiter = asyncio.get_running_loop().create_future()
            self._waiters[ticket] = waiter
            result = method(time.time(), ticket=ticket, **request)
            await self._settle()
        if result is not None:
            self._waiters.pop(ticket, None)
            return result
        try:
            return await waiter
        finally:
            self._waiters.pop(ticket, None)

    async def heartbeat(self, member_id: str, instance_id: str | None, generation: int) -> ErrorCode:
        async with self._lock:
            if isinstance(self.group, ConsumerGroup):
                return ErrorCode.unknown_member_id
            return self.group.heartbeat(time.time(), member_id, instance_id, generation)

    async def leave(self, members: list[tuple[str, str | None]]) -> tuple[ErrorCode, list[ErrorCode]]:
        async with self._lock:
            if isinstance(self.group, ConsumerGroup):
                return ErrorCode.none, [ErrorCode.unknown_member_id] * len(members)
            result = self.group.leave(time.time(), members)
            await self._settle()
            return result

    def _deliver(self) -> None:
        replies, self.group.replies = self.group.replies, []
        for ticket, result in replies:
            waiter = self._waiters.get(ticket)
            if waiter is not None and not waiter.done():
                waiter.set_result(result)

    async def _settle(self) -> None:
        """Hand out ready answers and do the writes the state machine asked for, until nothing is left."""
        while True:
            self._deliver()
            pending = self.group.pending_assignment
            if pending is not None:
                generation, assignment = pending
                error = await self._store_group(assignment)
                self.group.assignment_stored(time.time(), generation, assignment, error)
            elif self.group.store_requested:
                self.group.store_requested = False
                await self._store_group(None)
            else:
                break
        self._wake.set()

    def _submit_group(self, ops: list[Op], applied: Callable[[], None] | None,
                      assignment: dict[str, bytes] | None = None) -> asyncio.Future[None]:
        """Write the group's records that changed since the last write (and what was not written for sure), then
        `ops`, in one submission."""
        if isinstance(self.group, ConsumerGroup):
            wanted = consumer_group_records(self.group)
        else:
            wanted = group_records(self.group, assignment)
        changes, touched = self._records.changes(wanted)
        written = self._writes.submit(changes + ops, applied)

        def failed(f: asyncio.Future[None]) -> None:
            if not f.cancelled() and f.exception() is not None:
                self._records.failed(touched)
        written.add_done_callback(failed)
        return written

    async def _store_group(self, assignment: dict[str, bytes] | None) -> ErrorCode:
        stored = self._submit_group([], self._stored, assignment)
        return await self._outcome(stored, f"storing generation {self.group.generation}")

    def _stored(self) -> None:
        self._persisted = True

    async def _outcome(self, write: asyncio.Future[None], what: str) -> ErrorCode:
        """The error code a stored write's requester answers with."""
        try:
            await write
        except CoordinatorFenced:
            if not self.closed:
                self._fenced()
            return ErrorCode.not_coordinator
        except MetadataStoreError as e:
            log.warning("group %s: %s failed: %s", self.group_id, what, e)
            return ErrorCode.coordinator_not_available
        return ErrorCode.none

    async def _timer_loop(self) -> None:
        while not self.closed:
            delay = self.group.next_deadline() - time.time()
            if delay > 0:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=min(delay, 3600))
                continue
            async with self._lock:
                if self.closed:
                    return
                before = self.group.next_deadline()
                try:
                    self.group.expire(time.time())
                    await self._settle()
                except Exception:
                    log.exception("group %s: timer failed", self.group_id)
                moved = self.group.next_deadline() > before
            if not moved:  # a deadline that does not move would make this loop spin
                await asyncio.sleep(0.05)

    # ---------------------------------------------------------------- offsets

    async def commit(self, member_id: str, instance_id: str | None, generation: int,
                     entries: Sequence[tuple[str, int, OffsetEntry]],
                     api_version: int = 9) -> dict[TopicPartition, ErrorCode]:
        """Validate against the group, then make the offsets durable (fenced) before the caller answers: each
        partition's error (a consumer group may accept some partitions of a commit and not others, KIP-1251)."""
        async with self._lock:
            if isinstance(self.group, ConsumerGroup):
                check = self.group.check_commit(member_id, generation, api_version=api_version, transactional=False)
                errors = {(t, p): check.partition_error(t, p) for t, p, _ in entries}
            else:
                error = self.group.check_commit(time.time(), member_id, instance_id, generation)
                errors = {(t, p): error for t, p, _ in entries}
            accepted = [(t, p, e) for t, p, e in entries if errors[(t, p)] == ErrorCode.none]
            if not accepted:
                return errors
            ops: list[Op] = [Put(keys.group_offset(self.group_id, t, p), e.to_value()) for t, p, e in accepted]

            def applied() -> None:
                self._persisted = True
                for t, p, e in accepted:
                    self.offsets[(t, p)] = e

            written = self._submit_offsets(ops, applied)
        stored = await self._offsets_outcome(written)
        return {tp: stored if error == ErrorCode.none else error for tp, error in errors.items()}

    def _submit_offsets(self, ops: list[Op], applied: Callable[[], None] | None) -> asyncio.Future[None]:
        """Offsets of a group not stored yet go with its records: a standalone group becomes visible (ListGroups)
        with its first commit, and a reload finds it."""
        return self._writes.submit(ops, applied) if self._persisted else self._submit_group(ops, applied)

    async def _write_offsets(self, ops: list[Op]) -> ErrorCode:
        return await self._offsets_outcome(self._writes.submit(ops))

    async def _offsets_outcome(self, written: asyncio.Future[None]) -> ErrorCode:
        error = await self._outcome(written, "offset write")
        if error != ErrorCode.coordinator_not_available or self.closed:
            return error
        # The write may have happened with only its reply lost: read back what the store holds.
        try:
            stored = await self.meta.range(keys.group_offsets(self.group_id))
            pending = await self.meta.range(keys.group_txn_offsets(self.group_id))
        except MetadataStoreError:
            log.warning("group %s: store unreachable, unloading (a fresh load re-reads it)", self.group_id)
            if not self.closed:
                self._dead()  # memory may now disagree with the store
            return error
        self.offsets = parse_offsets(self.group_id, stored)
        self.pending = parse_pending(self.group_id, pending)
        return error

    async def delete_offsets(self, partitions: list[TopicPartition]
                             ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        """OffsetDelete: allowed for an Empty group, and for topics an active consumer group does not subscribe to."""
        async with self._lock:
            g = self.group
            if g.state is State.DEAD:
                return ErrorCode.group_id_not_found, {}
            errors = {tp: ErrorCode.none for tp in partitions}
            if g.state is not State.EMPTY:
                if g.protocol_type != "consumer":
                    return ErrorCode.non_empty_group, {}
                topics = g.subscribed_topics()  # None: not known (a subscription that does not parse)
                for tp in partitions:
                    if topics is None or tp[0] in topics:  # unknown counts as subscribed, as in Kafka
                        errors[tp] = ErrorCode.group_subscribed_to_topic
            gone = [tp for tp, e in errors.items() if e == ErrorCode.none and tp in self.offsets]
            deletes: list[Op] = [Delete(keys.group_offset(self.group_id, *tp)) for tp in gone]
            error = await self._write_offsets(deletes)
            if error != ErrorCode.none:
                return error, {}
            for tp in gone:
                self.offsets.pop(tp, None)
            return ErrorCode.none, errors

    async def expire_offsets(self, now_ms: int, retention_ms: int, gone: set[TopicPartition] | None = None) -> None:
        """Drop offsets past retention, and `gone` ones (of deleted topics); an Empty group left without offsets
        is removed altogether (Kafka)."""
        async with self._lock:
            if self.group.state is State.DEAD:
                return
            expired = expired_offsets(self.group, self.offsets, now_ms, retention_ms)
            expired += [tp for tp in sorted(gone or ()) if tp in self.offsets and tp not in expired]
            # An open transaction keeps the offsets it will replace, and the group (Kafka); one older than
            # retention will never end and is dropped (txn_offsets.abandoned).
            abandoned = txn_offsets.abandoned(self.pending, now_ms, retention_ms)
            unstable = txn_offsets.pending_partitions({p: r for p, r in self.pending.items() if p not in abandoned})
            expired = [tp for tp in expired if tp not in unstable]
            remove = (self.group.state is State.EMPTY and len(expired) == len(self.offsets)
                      and not self.group.pending_members and len(abandoned) == len(self.pending))
            if remove:
                await self._remove_group()
            elif expired or abandoned:
                deletes: list[Op] = [Delete(keys.group_offset(self.group_id, *tp)) for tp in expired]
                deletes += [Delete(keys.group_txn_offset(self.group_id, pid)) for pid in abandoned]
                if await self._write_offsets(deletes) == ErrorCode.none:
                    for tp in expired:
                        self.offsets.pop(tp, None)
                    for pid in abandoned:
                        self.pending.pop(pid, None)
            if abandoned:
                log.warning("group %s: pending offsets of producers %s dropped (no transaction end came)",
                            self.group_id, abandoned)
            if expired:
                log.info("group %s: %d offsets expired%s", self.group_id, len(expired), ", group removed" * remove)

    async def delete_group(self) -> ErrorCode:
        async with self._lock:
            if self.group.state is State.DEAD:
                return ErrorCode.group_id_not_found
            if self.group.state is not State.EMPTY:
                return ErrorCode.non_empty_group
            return await self._remove_group()

    async def _remove_group(self) -> ErrorCode:
        """Group record, offsets (pending ones too) and coordinator key go in one fenced transaction."""
        error = await self._outcome(self._writes.submit([
            Delete(keys.group(self.group_id)), Delete(keys.group_members(self.group_id), prefix=True),
            Delete(keys.group_offsets(self.group_id), prefix=True),
            Delete(keys.group_txn_offsets(self.group_id), prefix=True), Delete(keys.group_coordinator(self.group_id))
        ]), "delete")
        if error != ErrorCode.none:
            return error
        self.offsets.clear()
        self.pending.clear()
        self._dead()
        return ErrorCode.none

    # ---------------------------------------------------------------- transactional offsets (txn_offsets.py)

    async def txn_commit(self, producer_id: int, producer_epoch: int, transactional_id: str, member_id: str,
                         instance_id: str | None, generation: int,
                         entries: Sequence[tuple[str, int, OffsetEntry]]) -> ErrorCode:
        """TxnOffsetCommit: the offsets join the producer's pending record, durable (fenced) before the answer;
        OffsetFetch does not see them until the transaction commits (complete_txn)."""
        async with self._lock:
            if isinstance(self.group, ConsumerGroup):
                # All or nothing: one pending record per producer (Kafka answers each partition on its own).
                check = self.group.check_commit(member_id, generation, api_version=0, transactional=True)
                error = next((e for t, p, _ in entries if (e := check.partition_error(t, p)) != ErrorCode.none),
                             check.error)
            else:
                error = txn_offsets.check_txn_commit(self.group, member_id, instance_id, generation)
            if error == ErrorCode.none:
                error = txn_offsets.check_epoch(self.pending, producer_id, producer_epoch)
            if error != ErrorCode.none or not entries:
                return error
            record = txn_offsets.add_offsets(self.pending.get(producer_id), producer_id, producer_epoch,
                                             transactional_id, entries, int(time.time() * 1000))
            ops: list[Op] = [Put(keys.group_txn_offset(self.group_id, producer_id), record.to_value())]
            error = await self._offsets_outcome(self._submit_offsets(ops, None))
            if error == ErrorCode.none:
                self._persisted = True
                self.pending[producer_id] = record
            return error

    async def complete_txn(self, producer_id: int, producer_epoch: int, commit: bool) -> ErrorCode:
        """The producer's transaction ended: its pending offsets become committed (commit) or go (abort), and
        the record is deleted. Repeating it changes nothing (no record left: success)."""
        async with self._lock:
            if self.group.state is State.DEAD:  # deleted or fenced meanwhile: asked again, the registry knows
                return ErrorCode.coordinator_not_available
            error, done = txn_offsets.complete(self.pending, self.offsets, producer_id, producer_epoch, commit,
                                               int(time.time() * 1000))
            if done is None:
                return error
            ops: list[Op] = [Put(keys.group_offset(self.group_id, t, p), e.to_value())
                             for (t, p), e in sorted(done.committed.items())]
            # Last: written in several transactions (over MAX_TXN_OPS), a record left by a failure is completed
            # again by the coordinator's retry.
            ops.append(Delete(keys.group_txn_offset(self.group_id, producer_id)))
            error = await self._write_offsets(ops)
            if error == ErrorCode.none:
                self.offsets.update(done.committed)
                self.pending.pop(producer_id, None)
            return error

    # ---------------------------------------------------------------- store

    async def _txn(self, ops: list[Op]) -> None:
        """One fenced transaction (BatchedWrites makes them, in order)."""
        guard = [Compare(keys.group_coordinator(self.group_id), "mod_revision", "==", self._revision)]
        if not (await self.meta.txn(guard, ops)).succeeded:
            raise CoordinatorFenced(self.group_id)

    def _fenced(self) -> None:
        log.warning("group %s: coordinator fenced (another incarnation took the group over)", self.group_id)
        self._dead()

    def _dead(self) -> None:
        self.closed = True
        self.group.mark_dead()
        self._deliver()
        self._wake.set()
        self._on_dead(self)


def parse_offsets(group_id: str, kvs: Sequence[Any]) -> dict[TopicPartition, OffsetEntry]:
    prefix = len(keys.group_offsets(group_id))
    out = {}
    for kv in kvs:
        topic, _, partition = kv.key[prefix:].rpartition("/")
        out[(topic, int(partition))] = OffsetEntry.from_value(kv.value)
    return out
