"""A group coordinator's writes to the metadata store, one transaction in flight at a time, batched.

Writes that arrive while a transaction is in flight go together in the next one. Without batching a busy group is
bounded by the store's latency: 50 members committing offsets and heartbeating through a reassignment, each write
one transaction of 20-40 ms on a loaded machine, kept the group's lock busy for longer than a second per second,
and every heartbeat waited behind the commits until the clients timed it out.

Order is kept: a write submitted later is never durable before one submitted earlier, and the callbacks that apply
a write to memory run in submission order, as each becomes durable. A batch holds each key once (the later of two
writes to a key is the one that counts, as it would be written last); a prefix delete and a write larger than one
transaction go alone (the latter in several transactions, in order, as before batching).

The flush path has its own group commit (broker/commit_batcher.py): there every partition owner brings its own
guard, and a failed guard is retried owner by owner. A group has one guard for all its writes, and needs instead
each key once per transaction and its in-memory effects in order, so it has this smaller one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from kafscale.storage.metadata_store import MAX_TXN_OPS, Delete, Op

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Request:
    ops: Sequence[Op]
    done: asyncio.Future[None]
    applied: Callable[[], None] | None

    @property
    def alone(self) -> bool:
        return any(isinstance(op, Delete) and op.prefix for op in self.ops)


class BatchedWrites:
    def __init__(self, write: Callable[[list[Op]], Awaitable[None]], *, max_ops: int = MAX_TXN_OPS) -> None:
        """`write`: one fenced transaction of the given ops; raises on failure."""
        self._write = write
        self._max_ops = max_ops
        self._queue: list[_Request] = []
        self._last: asyncio.Future[None] | None = None  # the most recently submitted write's outcome
        self._flusher: asyncio.Task[None] | None = None

    def submit(self, ops: Sequence[Op], applied: Callable[[], None] | None = None) -> asyncio.Future[None]:
        """Queue `ops`. The future completes once they are durable, or with the write's exception; `applied` runs
        just before, only on success, in submission order."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(_Request(list(ops), done, applied))
        self._last = done
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush())
        return done

    @property
    def idle(self) -> bool:
        """Nothing submitted is still waiting to be written."""
        return self._last is None or self._last.done()

    def written(self) -> asyncio.Future[None]:
        """Completes once everything submitted so far is durable, with the outcome of the last write: an answer
        that reveals state must not go out before the state is stored."""
        if self._last is None:
            none: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            none.set_result(None)
            return none
        return asyncio.shield(self._last)  # a caller giving up must not cancel the write itself

    async def _flush(self) -> None:
        while self._queue:
            batch, ops = self._take()
            try:
                for i in range(0, len(ops), self._max_ops):
                    await self._write(ops[i:i + self._max_ops])
            except Exception as e:  # every write in the batch failed the same way; their callers decide
                for r in batch:
                    if not r.done.done():
                        r.done.set_exception(e)
                continue
            for r in batch:
                if r.applied is not None:
                    try:
                        r.applied()
                    except Exception:
                        log.exception("applying a stored group write failed")
                if not r.done.done():
                    r.done.set_result(None)

    def _take(self) -> tuple[list[_Request], list[Op]]:
        """The next batch, from the head of the queue: whole requests, each key once, at most max_ops ops (a
        larger single request or one with a prefix delete alone)."""
        first = self._queue.pop(0)
        batch, by_key = [first], {op.key: op for op in first.ops}
        if first.alone or len(by_key) > self._max_ops:
            return batch, list(first.ops)
        while self._queue and not self._queue[0].alone:
            merged = dict(by_key)
            for op in self._queue[0].ops:
                merged.pop(op.key, None)  # the later write goes after the earlier ones it replaces
                merged[op.key] = op
            if len(merged) > self._max_ops:
                break
            batch.append(self._queue.pop(0))
            by_key = merged
        return batch, list(by_key.values())

