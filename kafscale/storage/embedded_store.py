"""EmbeddedStore: the MetadataStore on one node, durable in a local SQLite file.

It mirrors etcd's data model so code written against it behaves the same on etcd: one store-wide
revision per mutating transaction, per-key create/mod revision and version, CAS transactions,
leases, and watches that resume from a revision out of a persisted event history.

Threading: a single writer thread owns the write connection and applies transactions in arrival
order. Whatever is queued while it commits is applied in the next SQLite transaction and made durable
by one fsync (group commit), each logical transaction still getting its own revision, so concurrent
writers get far more than the ~2,800 sequential fsynced commits/s this disk allows. Reads run inline
on the event loop on their own WAL connection: a point read costs ~10 µs, less than a thread hop.
Everything the loop keeps in memory (revision, recent events for watchers, lease deadlines) is updated
by a callback the writer schedules after each commit, in commit order, so it never runs ahead of disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import heapq
import logging
import math
import os
import queue
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafscale.storage.embedded_sql import PUT, SCHEMA, Effects, RawEvent, get_meta, prefix_end, select, unpack
from kafscale.storage.embedded_txn import Transactions
from kafscale.storage.metadata_store import (
    CompactedError,
    Compare,
    Delete,
    KeyValue,
    MetadataStore,
    MetadataStoreError,
    Op,
    Put,
    StoreStatus,
    TxnResult,
    WatchEvent,
)

log = logging.getLogger(__name__)

_MAX_GROUP = 512  # transactions per group commit: bounds the latency one fsync adds to the first one
_HISTORY_READ_REVISIONS = 1024  # revisions read from disk per step when a watcher is behind memory
_LEASE_POLL_MAX = 1.0


@dataclass
class _Work:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    future: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop


class EmbeddedStore(MetadataStore):
    """MetadataStore in the SQLite file at path (created if missing); one open instance per file.

    fsync=True (SQLite synchronous=FULL): a transaction is on disk when txn() returns, surviving a power
    cut, at ~0.2 ms per commit on this machine. fsync=False (synchronous=NORMAL) survives a crash of the
    process but may lose the last commits on power loss; it is ~5x faster sequentially.
    history_revisions: how many recent revisions of events are kept for watchers that resume;
    a watch asking for anything older gets CompactedError.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        history_revisions: int = 100_000,
        fsync: bool = True,
        memory_revisions: int = 4096,
    ) -> None:
        if history_revisions < 1:
            raise ValueError("history_revisions must be >= 1")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._memory_revisions = max(1, min(memory_revisions, history_revisions))
        self._closed = False

        # Two writers on one file would hand out the same revision twice: refuse a second open.
        self._lock_fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise MetadataStoreError(f"{self.path} is already open in another EmbeddedStore") from None

        try:
            self._wconn = self._connect(fsync)
            self._wconn.executescript(SCHEMA)
            self._tx = Transactions(self._wconn, history_revisions)
            self._rconn = self._connect(fsync)
            self._rconn.execute("PRAGMA query_only=ON")
        except sqlite3.Error as e:
            os.close(self._lock_fd)
            raise MetadataStoreError(f"cannot open {self.path}: {e}") from e

        # The loop-side mirror, touched only from the bound event loop once one exists.
        self._revision = 0
        self._compact_revision = 0
        self._buf: dict[int, tuple[RawEvent, ...]] = {}
        self._buf_start = 1
        self._leases: dict[int, float] = {}
        self._lease_heap: list[tuple[float, int]] = []
        self._load_mirror(self._wconn)
        self._wake = asyncio.Event()
        self._lease_wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lease_task: asyncio.Task[None] | None = None

        # A lease that ran out while no process had the file open was not let down by its holder, who could
        # not reach the store: as etcd does on restart, every lease gets its TTL again before anyone reads.
        # Expiring them instead would turn the store's restart into the death of every shard at once.
        fx = Effects()
        self._in_write_txn(self._tx.renew_all_leases, fx)
        self._apply(fx)

        self._queue: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._writer_main, name=f"embedded-store:{self.path}", daemon=True)
        self._writer.start()

    # ------------------------------------------------------------------ setup helpers

    def _connect(self, fsync: bool) -> sqlite3.Connection:
        # isolation_level=None: transactions are spelled out, so one BEGIN IMMEDIATE covers a group.
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
        conn.execute("PRAGMA busy_timeout=5000")
        # After a checkpoint the WAL is cut back to this; without it the file keeps its largest size for good.
        conn.execute("PRAGMA journal_size_limit=67108864")
        return conn

    def _load_mirror(self, conn: sqlite3.Connection) -> None:
        self._revision = get_meta(conn, "revision")
        self._compact_revision = get_meta(conn, "compact_revision")
        self._buf = {}
        self._buf_start = self._revision + 1
        self._reload_leases(conn)

    def _reload_leases(self, conn: sqlite3.Connection | None = None) -> None:
        self._leases = {}
        self._lease_heap = []
        for lease_id, expires_at in (conn or self._rconn).execute("SELECT id, expires_at FROM leases"):
            self._set_lease(lease_id, expires_at)

    def _bind(self) -> asyncio.AbstractEventLoop:
        """The event loop the in-memory mirror lives on: the first one that uses the store."""
        if self._closed:
            raise MetadataStoreError("store is closed")
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None:
                if not self._loop.is_closed():
                    raise MetadataStoreError("EmbeddedStore is bound to another running event loop")
                # Commits finished after the old loop closed never reached the mirror: reload it.
                self._load_mirror(self._rconn)
            self._loop = loop
            self._wake = asyncio.Event()
            self._lease_wake = asyncio.Event()
            self._lease_task = loop.create_task(self._lease_expiry_loop(), name=f"lease-expiry:{self.path}")
        return loop

    # ------------------------------------------------------------------ writer thread

    async def _submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        loop = self._bind()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.put(_Work(fn, args, future, loop))
        return await future

    def _writer_main(self) -> None:
        stop = False
        while not stop:
            item = self._queue.get()
            if item is None:
                break
            batch = [item]
            while len(batch) < _MAX_GROUP:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            try:
                self._run_group(batch)
            except BaseException as e:  # never let the thread die with callers waiting on it
                log.exception("embedded store writer failed")
                self._deliver(batch, None, [e] * len(batch))

    def _run_group(self, batch: list[_Work]) -> None:
        """Apply every queued transaction in one SQLite transaction, each isolated by a savepoint."""
        conn = self._wconn
        results: list[Any] = []
        group_fx = Effects()
        conn.execute("BEGIN IMMEDIATE")
        try:
            for work in batch:
                fx = Effects()
                saved_revision = self._tx.revision
                conn.execute("SAVEPOINT op")
                try:
                    result: Any = work.fn(fx, *work.args)
                except Exception as e:
                    conn.execute("ROLLBACK TO op")
                    self._tx.revision = saved_revision
                    result = e if isinstance(e, MetadataStoreError | ValueError) else MetadataStoreError(str(e))
                else:
                    group_fx.extend(fx)
                conn.execute("RELEASE op")
                results.append(result)
            self._tx.trim_history(group_fx)
            conn.execute("COMMIT")
        except BaseException as e:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            # Nothing of the group reached disk: forget the revisions it handed out.
            with contextlib.suppress(sqlite3.Error):
                self._tx.reload()
            error = MetadataStoreError(f"commit failed: {e}")
            self._deliver(batch, None, [error] * len(batch))
            return
        self._deliver(batch, group_fx, results)

    def _deliver(self, batch: list[_Work], fx: Effects | None, results: list[Any]) -> None:
        # One callback per loop keeps the mirror update and the wake-ups in commit order.
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any]]] = {}
        for work, result in zip(batch, results, strict=True):
            by_loop.setdefault(work.loop, []).append((work.future, result))
        for loop, outcomes in by_loop.items():
            with contextlib.suppress(RuntimeError):  # loop closed: nobody is waiting any more
                loop.call_soon_threadsafe(self._complete, fx if loop is self._loop else None, outcomes)

    def _complete(self, fx: Effects | None, outcomes: list[tuple[asyncio.Future[Any], Any]]) -> None:
        if fx is not None:
            self._apply(fx)
        for future, result in outcomes:
            if future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

    def _in_write_txn(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run one work function in its own transaction, synchronously (used only while opening)."""
        self._wconn.execute("BEGIN IMMEDIATE")
        try:
            result = fn(*args)
            self._wconn.execute("COMMIT")
            return result
        except BaseException:
            self._wconn.execute("ROLLBACK")
            raise

    # ------------------------------------------------------------------ loop-side mirror

    def _apply(self, fx: Effects) -> None:
        for revision, events in fx.revisions:
            # Revisions are contiguous (every one carries at least one event), so the buffer is a
            # window [_buf_start, _revision]; should it ever not follow on, restart it (older
            # revisions are then read from disk).
            if revision != self._buf_start + len(self._buf):
                self._buf = {}
                self._buf_start = revision
            self._buf[revision] = events
            self._revision = max(self._revision, revision)
        if fx.compact_revision is not None:
            self._compact_revision = max(self._compact_revision, fx.compact_revision)
        floor = max(self._compact_revision, self._revision + 1 - self._memory_revisions)
        while self._buf_start < floor:
            self._buf.pop(self._buf_start, None)
            self._buf_start += 1
        for lease_id, expires_at in fx.lease_changes:
            if expires_at is None:
                self._leases.pop(lease_id, None)
            else:
                self._set_lease(lease_id, expires_at)
        if fx.lease_changes:
            self._lease_wake.set()
        if fx.revisions or fx.compact_revision is not None:
            wake, self._wake = self._wake, asyncio.Event()
            wake.set()

    def _set_lease(self, lease_id: int, expires_at: float) -> None:
        self._leases[lease_id] = expires_at
        heapq.heappush(self._lease_heap, (expires_at, lease_id))

    def _next_expiry(self) -> float:
        heap = self._lease_heap
        # Entries are never updated in place: skip those a keepalive or revoke has superseded.
        while heap and self._leases.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf

    async def _expire_due_leases(self) -> None:
        """Reads never see a key whose lease has run out, even between two background sweeps."""
        if self._next_expiry() <= time.time():
            await self._submit(self._tx.expire_leases)

    async def _lease_expiry_loop(self) -> None:
        while not self._closed:
            delay = self._next_expiry() - time.time()
            if delay <= 0:
                try:
                    expired = await self._submit(self._tx.expire_leases)
                except MetadataStoreError:
                    if self._closed:
                        return
                    log.exception("lease expiry failed; retrying")
                    await asyncio.sleep(_LEASE_POLL_MAX)
                    continue
                if not expired:
                    # Due here but not on disk: the wall clock stepped back, or the mirror is stale.
                    # Re-read the deadlines and pause, rather than spin.
                    self._reload_leases()
                    await asyncio.sleep(0.05)
                continue
            self._lease_wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lease_wake.wait(), min(delay, _LEASE_POLL_MAX))

    # ------------------------------------------------------------------ reads

    async def get(self, key: str) -> KeyValue | None:
        self._bind()
        await self._expire_due_leases()
        found = self._read(key, False)
        return found[0] if found else None

    async def range(self, prefix: str) -> list[KeyValue]:
        self._bind()
        await self._expire_due_leases()
        return self._read(prefix, True)

    def _read(self, key: str, prefix: bool) -> list[KeyValue]:
        try:
            return select(self._rconn, key, prefix)
        except sqlite3.Error as e:
            raise MetadataStoreError(f"read failed: {e}") from e

    async def revision(self) -> int:
        self._bind()
        return self._revision

    async def status(self) -> StoreStatus:
        self._bind()
        size = 0
        for f in (self.path, Path(f"{self.path}-wal")):
            with contextlib.suppress(OSError):
                size += f.stat().st_size
        return StoreStatus(self._revision, size)

    # ------------------------------------------------------------------ writes

    async def put(self, key: str, value: Any, lease: int = 0) -> int:
        result: TxnResult = await self._submit(self._tx.txn, (), (Put(key, value, lease),), ())
        return result.revision

    async def delete(self, key: str, prefix: bool = False) -> int:
        result: TxnResult = await self._submit(self._tx.txn, (), (Delete(key, prefix),), ())
        return int(result.responses[0])

    async def txn(self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()) -> TxnResult:
        # Compares and reads of a txn go through the writer too: they must see the same state as its writes.
        await self._expire_due_leases()
        return await self._submit(self._tx.txn, tuple(compares), tuple(success), tuple(failure))

    async def compact(self, revision: int) -> None:
        """Drop the event history before revision; watches from earlier revisions get CompactedError."""
        await self._submit(self._tx.compact_request, revision)

    async def lease_grant(self, ttl_seconds: float) -> int:
        if ttl_seconds <= 0:
            raise ValueError("ttl_seconds must be positive")
        return await self._submit(self._tx.lease_grant, float(ttl_seconds))

    async def lease_keepalive(self, lease_id: int) -> bool:
        return await self._submit(self._tx.lease_keepalive, lease_id)

    async def lease_revoke(self, lease_id: int) -> None:
        await self._submit(self._tx.lease_revoke, lease_id)

    # ------------------------------------------------------------------ watch

    async def watch(self, prefix: str, start_revision: int = 0) -> AsyncIterator[WatchEvent]:
        self._bind()
        start = prefix.encode()
        end = prefix_end(start)
        next_rev = start_revision if start_revision > 0 else self._revision + 1
        while not self._closed:
            wake = self._wake  # taken before looking, so a commit landing meanwhile still wakes us
            if next_rev < self._compact_revision:
                raise CompactedError(f"revision {next_rev} is compacted (oldest kept: {self._compact_revision})")
            if next_rev > self._revision:
                await wake.wait()
                continue
            if next_rev >= self._buf_start:
                last = self._revision
                raw = [(rev, e) for rev in range(next_rev, last + 1) for e in self._buf[rev]]
            else:
                last = min(self._buf_start - 1, next_rev + _HISTORY_READ_REVISIONS - 1)
                raw = self._read_history(next_rev, last)
            next_rev = last + 1
            for rev, (etype, key, value) in raw:
                if key >= start and (end is None or key < end):
                    yield WatchEvent(
                        "put" if etype == PUT else "delete",
                        key.decode(),
                        unpack(value) if value is not None else None,
                        rev,
                    )

    def _read_history(self, first: int, last: int) -> list[tuple[int, RawEvent]]:
        """Events of revisions [first, last] from disk, for a watcher that is behind the memory window."""
        conn = self._rconn
        try:
            conn.execute("BEGIN")  # one snapshot for the compaction check and the rows
            try:
                compacted = get_meta(conn, "compact_revision")
                if first < compacted:
                    raise CompactedError(f"revision {first} is compacted (oldest kept: {compacted})")
                rows = conn.execute(
                    "SELECT revision, type, key, value FROM events WHERE revision BETWEEN ? AND ?"
                    " ORDER BY revision, seq",
                    (first, last),
                ).fetchall()
            finally:
                conn.execute("COMMIT")
        except sqlite3.Error as e:
            raise MetadataStoreError(f"reading watch history failed: {e}") from e
        return [(rev, (t, k, v)) for rev, t, k, v in rows]

    # ------------------------------------------------------------------ lifecycle

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        task, self._lease_task = self._lease_task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._queue.put(None)  # the writer finishes what was queued before it, then exits
        await asyncio.get_running_loop().run_in_executor(None, self._writer.join)
        self._wake.set()
        self._wconn.close()
        self._rconn.close()
        os.close(self._lock_fd)
