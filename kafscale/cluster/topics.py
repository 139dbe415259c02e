"""Topic registry: every shard's view of topics/{name}, kept current by a watch on the metadata store."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kafscale.cluster import keys
from kafscale.cluster.placement import spread
from kafscale.cluster.virtual import NewTopicLayout, VirtualMapping, new_topic_layout
from kafscale.storage.keys import MAX_TOPIC_NAME as MAX_TOPIC_NAME  # the one topic name rule, re-exported
from kafscale.storage.keys import topic_name_problem as topic_name_problem
from kafscale.storage.metadata_store import Compare, Delete, MetadataStore, Put

log = logging.getLogger(__name__)

@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    id: uuid.UUID
    partitions: int
    placement: list[int]
    configs: dict[str, Any] = field(default_factory=dict)
    created_ms: int = 0
    leader_epochs: list[int] = field(default_factory=list)  # per partition; missing entries are 0
    # Virtual partitions (kafscale.cluster.virtual): the physical partitions the `partitions` that clients see
    # share, partition p in physical partition p % physical. 0: a plain topic, every partition its own.
    physical: int = 0

    def to_value(self) -> dict[str, Any]:
        value = {"id": str(self.id), "partitions": self.partitions, "placement": self.placement,
                 "configs": self.configs, "created_ms": self.created_ms, "leader_epochs": self.leader_epochs}
        if self.physical:
            value["physical"] = self.physical
        return value

    @classmethod
    def from_value(cls, name: str, v: dict[str, Any]) -> TopicInfo:
        return cls(name, uuid.UUID(v["id"]), int(v["partitions"]), list(v["placement"]),
                   dict(v.get("configs", {})), int(v.get("created_ms", 0)), list(v.get("leader_epochs", ())),
                   int(v.get("physical", 0)))

    @property
    def units(self) -> int:
        """How many placement units (physical partitions) the topic has: what moves between shards."""
        return self.physical or self.partitions

    def unit_of(self, partition: int) -> int:
        return partition % self.physical if self.physical else partition

    def lanes(self, unit: int) -> list[int]:
        """The partitions clients see in one physical partition (itself, for a plain topic)."""
        return list(range(unit, self.partitions, self.physical)) if self.physical else [unit]

    def moved(self, partition: int, shard: int) -> TopicInfo:
        """This topic with a partition led by another shard, at the next leader epoch. A virtual partition
        moves with its physical partition's others: one shard owns them all."""
        epochs = [*self.leader_epochs, *[0] * (self.partitions - len(self.leader_epochs))]
        placement = list(self.placement)
        for lane in self.lanes(self.unit_of(partition)):
            epochs[lane] += 1
            placement[lane] = shard
        return dataclasses.replace(self, placement=placement, leader_epochs=epochs)


class TopicExistsError(Exception):
    """The name is taken: by a topic, or (`deleting`) by a deleted topic whose objects are still being removed."""

    def __init__(self, name: str, deleting: bool = False) -> None:
        super().__init__(name)
        self.deleting = deleting


class TopicRegistry:
    def __init__(self, meta: MetadataStore, mapping: VirtualMapping | None = None) -> None:
        self.meta = meta
        self.mapping = mapping  # which new topics get virtual partitions (`serve --virtual-partitions-mapping`)
        self.topics: dict[str, TopicInfo] = {}
        self.by_id: dict[uuid.UUID, TopicInfo] = {}
        self.generation = 0  # counts changes of the view, so answers built from it can be reused until it moves
        # callables(name, old, new) on every change after start()'s initial load; None: no such topic
        self.listeners: list[Any] = []
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        revision = await self.resync(notify=False)  # what exists is not a change
        self._watch = asyncio.get_running_loop().create_task(self._follow(revision))

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch

    async def _follow(self, revision: int) -> None:
        while True:
            try:
                async for event in self.meta.watch(keys.TOPICS, start_revision=revision):
                    revision = event.mod_revision + 1
                    self._set(event.key[len(keys.TOPICS):], event.value if event.type == "put" else None)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the store will come back; resync then
                log.warning("topic watch interrupted: %s", e)
                await asyncio.sleep(0.5)
                with contextlib.suppress(Exception):
                    revision = await self.resync()

    async def resync(self, notify: bool = True) -> int:
        """Replace the view with what the store holds now (at start, and after a watch gap, whose events
        are lost): topics deleted meanwhile go too. Returns the revision to watch from."""
        revision = await self.meta.revision()
        present = {kv.key[len(keys.TOPICS):]: kv.value for kv in await self.meta.range(keys.TOPICS)}
        for name in [n for n in self.topics if n not in present]:
            self._set(name, None, notify)
        for name, value in present.items():
            self._set(name, value, notify)
        return revision + 1

    def _set(self, name: str, value: dict[str, Any] | None, notify: bool = True) -> None:
        old = self.topics.pop(name, None)
        if old is not None:
            self.by_id.pop(old.id, None)
        info = TopicInfo.from_value(name, value) if value is not None else None
        if info is not None:
            self.topics[name] = info
            self.by_id[info.id] = info
        if old == info:
            return
        self.generation += 1
        if notify:
            for listener in self.listeners:
                listener(name, old, info)

    async def get(self, name: str) -> TopicInfo | None:
        """Local view first; a miss asks the store, since a watch event may still be on its way."""
        info = self.topics.get(name)
        if info is None:
            kv = await self.meta.get(keys.topic(name))
            if kv is not None:
                self._set(name, kv.value)
                info = self.topics.get(name)
        return info

    def layout(self, name: str, requested: int | None, default: int, configs: dict[str, str]) -> NewTopicLayout:
        """The partitions a new topic gets (kafscale.cluster.virtual.new_topic_layout, under this mapping)."""
        return new_topic_layout(name, requested, default, configs, self.mapping)

    async def create(self, name: str, partitions: int, shard_ids: Sequence[int],
                     configs: dict[str, Any] | None = None, validate_only: bool = False,
                     physical: int = 0) -> TopicInfo:
        """A new topic, its partitions spread over shard_ids (the live shards: the controller balances
        later, so creation never waits for it). physical: the physical partitions of a topic with virtual
        partitions (0: none); each physical partition's virtual ones are placed together."""
        units = spread(name, physical or partitions, shard_ids)
        placement = [units[p % len(units)] for p in range(partitions)]
        info = TopicInfo(name, uuid.uuid4(), partitions, placement, dict(configs or {}),
                         int(time.time() * 1000), [0] * partitions, physical)
        if validate_only:
            if await self.get(name) is not None:
                raise TopicExistsError(name)
            return info
        # Not while a deleted topic of this name still has objects: the new topic's would mix with them.
        result = await self.meta.txn([Compare(keys.topic(name), "version", "==", 0),
                                      Compare(keys.deleted_topic(name), "version", "==", 0)],
                                     [Put(keys.topic(name), info.to_value())])
        if not result.succeeded:
            raise TopicExistsError(name, deleting=await self.meta.get(keys.deleted_topic(name)) is not None)
        self._set(name, info.to_value())
        return info

    async def modify(self, name: str, change: Any) -> TopicInfo | None:
        """Apply change(TopicInfo) -> TopicInfo with compare-and-swap, so two admins altering one
        topic at once (configs here, partitions there) cannot undo each other. None: no such topic.
        change may raise to refuse; it is called again if another writer got in first."""
        while True:
            kv = await self.meta.get(keys.topic(name))
            if kv is None:
                return None
            info = change(TopicInfo.from_value(name, kv.value))
            result = await self.meta.txn([Compare(keys.topic(name), "mod_revision", "==", kv.mod_revision)],
                                         [Put(keys.topic(name), info.to_value())])
            if result.succeeded:
                self._set(name, info.to_value())
                return info

    async def delete(self, name: str) -> bool:
        result = await self.meta.txn(
            [Compare(keys.topic(name), "version", ">", 0)],
            [Delete(keys.topic(name)), Delete(keys.partition_prefix(name), prefix=True),
             Put(keys.deleted_topic(name), {"at_ms": int(time.time() * 1000)})],
        )
        if result.succeeded:
            self._set(name, None)
        return result.succeeded
