"""Group commit of partition states: the flush commits of all partition owners of one shard share metadata
transactions.

Every flush ends with one fenced transaction (compare the owner key's revision, put the partition state, the
segment records and producer states). With many partitions per shard those transactions — each a Ray call to
the metadata actor or a round trip to etcd — cost more than the data path itself. So an owner hands its
transaction here: when none is in flight it goes at once; commits that arrive meanwhile wait for it and then
go together, all their compares and all their puts in one transaction (up to MAX_TXN_OPS operations). If that
combined transaction's compares fail, one of the owners was fenced: each commit of the batch is then retried
on its own, so that only the fenced one is refused.

The lanes of one pack (kafscale.broker.packer) learn that their segments are stored at the same moment, and
their commits follow within a few loop turns. The packer announces them (`expect`: the pack and its lanes), and
the next transaction waits until each lane announced before it began has a commit queued, for at most GATHER_S
from when it began: one transaction per pack, as a plain partition has one per segment. A lane with a commit
queued already (for its previous pack) counts as arrived, since its next one cannot come before that is sent;
packs announced during the wait are the next transaction's business, so a stream of announcements never holds
a transaction longer than GATHER_S.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from kafscale.storage.metadata_store import MAX_TXN_OPS, Compare, MetadataStore, Op

GATHER_S = 0.02  # how long a transaction waits for the announced commits of a pack's lanes


@dataclass(slots=True)
class _Commit:
    compares: Sequence[Compare]
    ops: Sequence[Op]
    owner: Hashable | None = None  # who commits (a lane: its topic and partition), for the announced packs
    done: asyncio.Future[bool] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    @property
    def size(self) -> int:
        return len(self.compares) + len(self.ops)


class CommitBatcher:
    def __init__(self, meta: MetadataStore) -> None:
        self.meta = meta
        self._queue: deque[_Commit] = deque()
        self._drainer: asyncio.Task[None] | None = None
        self.transactions = 0  # metadata transactions sent, for tests and metrics
        self._expected: dict[str, set[Hashable]] = {}  # pack -> its lanes whose commit has not come yet
        self._arrived = asyncio.Event()

    def expect(self, group: str, owners: Iterable[Hashable]) -> None:
        """The commits of `owners` naming `group` are about to arrive: hold the next transaction for them."""
        waiting = set(owners)
        if len(waiting) > 1:  # one alone has nobody to share with
            self._expected[group] = waiting

    async def commit(self, compares: Sequence[Compare], ops: Sequence[Op], groups: Sequence[str] = (),
                     owner: Hashable | None = None) -> bool:
        """Apply ops if every compare holds; False if one does not (the caller is fenced). Store errors are
        raised: the commit may or may not have been applied, as with a direct transaction. `groups`: the
        announced groups (packs) this commit of `owner` belongs to."""
        request = _Commit(compares, ops, owner)
        self._queue.append(request)
        for group in groups:
            waiting = self._expected.get(group)
            if waiting is not None:
                waiting.discard(owner)
                if not waiting:
                    del self._expected[group]
        self._arrived.set()
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.get_running_loop().create_task(self._drain())
        return await asyncio.shield(request.done)

    async def _gathered(self) -> None:
        """Wait, for at most GATHER_S, until every lane of the packs announced so far has a commit queued."""
        considered = list(self._expected)
        until = time.monotonic() + GATHER_S
        try:
            while True:
                queued = {r.owner for r in self._queue}
                if all(self._expected.get(g, set()) <= queued for g in considered):
                    return
                self._arrived.clear()
                left = until - time.monotonic()
                if left <= 0:
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), left)
        finally:
            for group in considered:  # waited for once: a lane that never came does not hold the next one
                self._expected.pop(group, None)

    async def _drain(self) -> None:
        while self._queue:
            await self._gathered()
            ready, self._queue = self._queue, deque()  # gathered once, then sent in chunks back to back
            while ready:
                batch, size = [], 0
                while ready and (not batch or size + ready[0].size <= MAX_TXN_OPS):
                    size += ready[0].size
                    batch.append(ready.popleft())
                await self._send_batch(batch)

    async def _send_batch(self, batch: list[_Commit]) -> None:
        try:
            if await self._send([c for r in batch for c in r.compares], [o for r in batch for o in r.ops]):
                _settle(batch, True)
            elif len(batch) == 1:
                _settle(batch, False)
            else:  # somebody in the batch is fenced: find out who, one by one
                for request in batch:
                    try:
                        _settle([request], await self._send(request.compares, request.ops))
                    except Exception as e:
                        _fail([request], e)
        except Exception as e:
            _fail(batch, e)

    async def _send(self, compares: Sequence[Compare], ops: Sequence[Op]) -> bool:
        self.transactions += 1
        return (await self.meta.txn(compares, ops)).succeeded


def _settle(batch: list[_Commit], succeeded: bool) -> None:
    for request in batch:
        if not request.done.done():
            request.done.set_result(succeeded)


def _fail(batch: list[_Commit], error: Exception) -> None:
    for request in batch:
        if not request.done.done():
            request.done.set_exception(error)
            request.done.exception()  # retrieved: a caller that gave up must not leave a warning behind
