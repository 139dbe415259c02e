"""The partition owners one shard hosts: opened on first use (or at a topic's creation), closed on stop.

An owner opens by taking a new epoch and reading its partition's state (kafscale.broker.partition_owner).
A shard hosting thousands of partitions must not start thousands of those transactions at once, so at most
OPENS_AT_ONCE run together, whatever asks for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from kafscale.broker.commit_batcher import CommitBatcher
from kafscale.broker.packer import TICK_GATHER, TICK_GATHER_MAX_S, Packer, PhysicalPartition
from kafscale.broker.partition_owner import OwnerSettings, PartitionOwner
from kafscale.broker.stats import BrokerMetrics
from kafscale.storage.async_store import AsyncObjectStore
from kafscale.storage.cache import ByteLRU
from kafscale.storage.metadata_store import MetadataStore

log = logging.getLogger(__name__)

# A new topic's partitions open at creation when the shard hosts at most EARLY_OPEN_MAX of them: a
# 10,000-partition topic opens on first use instead of as a burst of metadata transactions. Early opens
# take at most EARLY_OPENS_AT_ONCE of the OPENS_AT_ONCE slots below, so that opens a client is waiting
# for are not queued behind many topics created together.
EARLY_OPEN_MAX = 64
EARLY_OPENS_AT_ONCE = 8
OPEN_ON_STOP_S = 10.0  # how long close() waits for owners still opening (metadata store slow or down)
# Opens in progress at once, whatever asks for them: a client touching thousands of unopened partitions
# (or every partition of a restarted shard) queues here instead of starting thousands of epoch
# transactions together. Enough to keep the metadata store's group commits full.
OPENS_AT_ONCE = 64

Key = tuple[str, int]


class OwnerTable:
    def __init__(self, shard_id: int, *, meta: MetadataStore, objects: AsyncObjectStore, cache: ByteLRU,
                 settings: OwnerSettings, committer: CommitBatcher, metrics: BrokerMetrics,
                 topic_configs: Callable[[str], dict[str, Any]],
                 packs_of: Callable[[str, int], PhysicalPartition | None] = lambda _t, _p: None) -> None:
        self.shard_id = shard_id
        self.meta = meta
        self.objects = objects
        self.cache = cache
        self.settings = settings
        self.committer = committer  # the owners' flush commits share metadata transactions
        self.metrics = metrics
        self.topic_configs = topic_configs
        # the partitions whose segments share a partition's packs; None: its segments are objects of their own
        self.packs_of = packs_of
        # one per physical partition of a virtual topic led here, and one per plain topic that packs (index None)
        self.packers: dict[tuple[str, int | None], Packer] = {}
        self.owners: dict[Key, PartitionOwner] = {}
        self.opening: dict[Key, asyncio.Task[PartitionOwner]] = {}
        self._early: set[asyncio.Task[None]] = set()  # owners of new partitions, opened before use
        self._early_slots = asyncio.Semaphore(EARLY_OPENS_AT_ONCE)
        self._slots = asyncio.Semaphore(OPENS_AT_ONCE)
        self.closing = False

    def ready(self, key: Key) -> PartitionOwner | None:
        """The open owner of a partition, if there is one (no wait)."""
        owner = self.owners.get(key)
        return owner if owner is not None and not owner.fenced else None

    async def get(self, topic: str, partition: int) -> PartitionOwner:
        """The owner, opened (state recovered, epoch taken) on first use. Raises what the open raised."""
        key = (topic, partition)
        owner = self.ready(key)
        if owner is not None:
            return owner
        task = self.opening.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._open(topic, partition))
            self.opening[key] = task
            task.add_done_callback(lambda _t: self.opening.pop(key, None))
        return await asyncio.shield(task)

    async def _open(self, topic: str, partition: int) -> PartitionOwner:
        old = self.owners.pop((topic, partition), None)
        if old is not None:
            await old.close(flush=False)
        owner = PartitionOwner(topic, partition, shard_id=self.shard_id, meta=self.meta, objects=self.objects,
                               cache=self.cache, settings=self.settings,
                               topic_config=lambda: self.topic_configs(topic), metrics=self.metrics.partition(topic),
                               committer=self.committer, packer=self._packer(topic, partition))
        async with self._slots:
            await owner.open()
        self.owners[(topic, partition)] = owner
        return owner

    def _packer(self, topic: str, partition: int) -> Packer | None:
        found = self.packs_of(topic, partition)
        if found is None:
            return None
        packer = self.packers.get((topic, found.index))
        if packer is None:
            interval = self.settings.flush_interval_ms / 1000
            # A virtual topic's lanes seal on their own clocks: its pack waits a whole interval for them. A plain
            # topic's seal on the shared ticks, so its pack only waits for the tick's segments to be built.
            ticks = found.index is None
            window = min(interval * TICK_GATHER, TICK_GATHER_MAX_S) if ticks else interval
            packer = self.packers[(topic, found.index)] = Packer(
                self.objects, self.settings.namespace, topic, found.index, found.lanes, found.layout, window,
                self.committer.expect)
        elif packer.layout != found.layout:  # a plain topic's partitions added since (CreatePartitions)
            packer.lanes, packer.layout = found.lanes, found.layout
        return packer

    def open_early(self, topic: str, partitions: list[int]) -> None:
        """Open a new topic's (or new partitions') owners now, as Kafka's leaders do on creation, so the
        first produce does not wait for the open; too many at once open on first use instead."""
        if self.closing or len(partitions) > EARLY_OPEN_MAX:
            return
        for partition in partitions:
            task = asyncio.get_running_loop().create_task(self._open_early(topic, partition))
            self._early.add(task)
            task.add_done_callback(self._early.discard)

    async def _open_early(self, topic: str, partition: int) -> None:
        async with self._early_slots:
            if self.closing or (topic, partition) in self.owners:
                return
            try:
                await self.get(topic, partition)
            except Exception as e:  # the first produce opens it (and reports the error) instead
                log.info("early open of %s-%d failed: %s", topic, partition, e)

    def drop(self, topic: str, keep: Callable[[int], bool], flush: bool = False) -> None:
        """Stop the owners of a topic's partitions that no longer belong here: deleted or re-created (nothing
        to keep), or moved (flush: commit what is buffered, unless the successor has fenced us already)."""
        for (name, partition), owner in list(self.owners.items()):
            if name == topic and not keep(partition):
                self._let_go(owner, flush)
        if not any(name == topic for name, _ in self.owners):
            for key in [k for k in self.packers if k[0] == topic]:
                del self.packers[key]

    def drop_all(self) -> None:
        """Stop every owner (the shard's lease is lapsing): what is buffered is flushed if still allowed."""
        for owner in list(self.owners.values()):
            self._let_go(owner, flush=True)
        for task in list(self.opening.values()):
            task.cancel()

    def _let_go(self, owner: PartitionOwner, flush: bool) -> None:
        self.owners.pop((owner.topic, owner.partition), None)
        owner.reader.forget()
        asyncio.get_running_loop().create_task(owner.close(flush=flush))

    async def release(self, topic: str, partition: int) -> PartitionOwner | None:
        """A planned move: the owner stops taking appends, flushes, commits and stops. Returns it (None: it
        was not open). An open in progress finishes first, so that nothing it accepts is left behind."""
        task = self.opening.get((topic, partition))
        if task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(task)
        owner = self.owners.pop((topic, partition), None)
        if owner is None:
            return None
        await owner.close(flush=True)
        owner.reader.forget()
        return owner

    async def cancel_early_opens(self) -> None:
        self.closing = True
        for task in self._early:
            task.cancel()
        await asyncio.gather(*self._early, return_exceptions=True)

    async def close(self) -> None:
        """Let opens in progress finish (or give up) so that no owner appears after the flush, then flush
        and release every owner."""
        await self.cancel_early_opens()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*self.opening.values(), return_exceptions=True), OPEN_ON_STOP_S)
        log.info("shard %d stopping: flushing %d partitions", self.shard_id, len(self.owners))
        await asyncio.gather(*(o.close(flush=True) for o in self.owners.values()), return_exceptions=True)
        self.owners.clear()
