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
their commits follow within a few loop turns. The packer announces them (`expect`), and the next transaction
waits for all of them, for at most GATHER_S: one transaction per pack, as a plain partition has one per
segment. A lane that cannot commit yet (its earlier segment still uploading) costs the others that wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from kafscale.storage.metadata_store import MAX_TXN_OPS, Compare, MetadataStore, Op

GATHER_S = 0.02  # how long a transaction waits for the announced commits of a pack's lanes


@dataclass(slots=True)
class _Commit:
    compares: Sequence[Compare]
    ops: Sequence[Op]
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
        self._expected: dict[str, tuple[int, float]] = {}  # pack -> (commits still to come, give up at)
        self._arrived = asyncio.Event()

    def expect(self, group: str, count: int) -> None:
        """`count` commits naming `group` are about to arrive: hold the next transaction for them."""
        self._expected[group] = (count, time.monotonic() + GATHER_S)

    async def commit(self, compares: Sequence[Compare], ops: Sequence[Op], groups: Sequence[str] = ()) -> bool:
        """Apply ops if every compare holds; False if one does not (the caller is fenced). Store errors are
        raised: the commit may or may not have been applied, as with a direct transaction. `groups`: the
        announced groups (packs) this commit belongs to."""
        request = _Commit(compares, ops)
        self._queue.append(request)
        for group in groups:
            left, until = self._expected.pop(group, (0, 0.0))
            if left > 1:
                self._expected[group] = (left - 1, until)
        self._arrived.set()
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.get_running_loop().create_task(self._drain())
        return await asyncio.shield(request.done)

    async def _gathered(self) -> None:
        """Wait until every announced commit has arrived or waited long enough."""
        while self._expected:
            now = time.monotonic()
            for group in [g for g, (_, until) in self._expected.items() if until <= now]:
                del self._expected[group]
            if not self._expected:
                return
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), min(u for _, u in self._expected.values()) - now)

    async def _drain(self) -> None:
        while self._queue:
            await self._gathered()
            batch, size = [], 0
            while self._queue and (not batch or size + self._queue[0].size <= MAX_TXN_OPS):
                size += self._queue[0].size
                batch.append(self._queue.popleft())
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
