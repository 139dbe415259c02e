"""The group coordinators one shard hosts: loading (with the coordinator epoch), listing, offset retention, lag.

A group belongs to the shard FindCoordinator names for it (kafscale.cluster.placement); requests for other groups get
NOT_COORDINATOR and the client asks FindCoordinator again, as with Kafka. At start the shard loads every stored
group that hashes to it (as a Kafka broker loads its __consumer_offsets partitions), so sessions of members that
never come back still expire; a group first seen later is loaded on its first request.

Loading takes the group's coordinator key (group_coordinators/{g}) with a compare-and-swap that bumps its epoch,
then reads the group and its offsets: from then on only this incarnation's writes succeed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING
from urllib.parse import unquote

from kio.schema.errors import ErrorCode

from kafscale.cluster import keys
from kafscale.config import BrokerConfig
from kafscale.groups.consumer.group import ConsumerGroup, ConsumerSettings
from kafscale.groups.consumer.stored import is_consumer_group, load_consumer_group
from kafscale.groups.coordinator import GroupCoordinator, parse_offsets
from kafscale.groups.offsets import OffsetEntry, TopicPartition
from kafscale.groups.state import Group, GroupSettings, State
from kafscale.groups.stored import load_group
from kafscale.groups.txn_offsets import parse_pending, pending_partitions
from kafscale.storage.metadata_store import Compare, Delete, MetadataStore, MetadataStoreError, Put

if TYPE_CHECKING:
    from kafscale.cluster.topics import TopicInfo

log = logging.getLogger(__name__)


class GroupRegistry:
    def __init__(self, shard_id: int, meta: MetadataStore, settings: GroupSettings, *, owns: Callable[[str], bool],
                 offsets_retention_ms: int, retention_check_interval_s: float,
                 topic: Callable[[str], Awaitable[TopicInfo | None]] | None = None,
                 consumer_settings: ConsumerSettings | None = None) -> None:
        self.shard_id = shard_id
        self.meta = meta
        self.settings = settings
        self.consumer_settings = consumer_settings or ConsumerSettings()
        self.owns = owns  # is this shard the coordinator of a group id?
        self.topic = topic  # the topic of a name as it exists now; None: every committed offset counts
        self.offsets_retention_ms = offsets_retention_ms
        self.retention_check_interval_s = retention_check_interval_s
        self.groups: dict[str, GroupCoordinator] = {}
        self._loading: dict[str, asyncio.Task[GroupCoordinator | None]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._loaded = asyncio.Event()
        self.closed = False

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._load_all()), loop.create_task(self._retention_loop())]

    async def close(self) -> None:
        self.closed = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._loading.values()):
            task.cancel()
        await asyncio.gather(*(c.close() for c in list(self.groups.values())), return_exceptions=True)
        self.groups.clear()

    def check(self, group_id: str) -> ErrorCode:
        """The error every group request gets before touching a group this shard cannot serve."""
        if self.closed:
            return ErrorCode.coordinator_not_available
        if not self.owns(group_id):
            return ErrorCode.not_coordinator
        return ErrorCode.none

    async def get(self, group_id: str, *, create: bool = False) -> GroupCoordinator | None:
        """The group's coordinator, loaded on first use; None if the group does not exist and create is False.

        Raises MetadataStoreError when the store cannot be read (callers answer COORDINATOR_NOT_AVAILABLE).
        """
        while True:
            coordinator = self.groups.get(group_id)
            if coordinator is not None:
                return coordinator
            task = self._loading.get(group_id)
            if task is None or task.done():
                task = asyncio.get_running_loop().create_task(self._load(group_id, create))
                self._loading[group_id] = task
                task.add_done_callback(lambda _t: self._loading.pop(group_id, None))
                return await asyncio.shield(task)
            found = await asyncio.shield(task)
            if found is not None or not create:
                return found

    async def lookup(self, group_id: str, *, create: bool = False) -> tuple[ErrorCode, GroupCoordinator | None]:
        """What a request handler needs: an error to answer with, or the coordinator (None: no such group)."""
        error = self.check(group_id)
        if error != ErrorCode.none:
            return error, None
        try:
            return ErrorCode.none, await self.get(group_id, create=create)
        except MetadataStoreError as e:
            log.warning("group %s cannot be loaded: %s", group_id, e)
            return ErrorCode.coordinator_not_available, None

    async def _load(self, group_id: str, create: bool) -> GroupCoordinator | None:
        if await self.meta.get(keys.group(group_id)) is None and not create:
            return None
        revision = await self._take_epoch(group_id)
        record = await self.meta.get(keys.group(group_id))
        if record is None and not create:  # deleted meanwhile: give the key back
            await self.meta.txn([Compare(keys.group_coordinator(group_id), "mod_revision", "==", revision)],
                                [Delete(keys.group_coordinator(group_id))])
            return None
        offsets = parse_offsets(group_id, await self.meta.range(keys.group_offsets(group_id)))
        pending = parse_pending(group_id, await self.meta.range(keys.group_txn_offsets(group_id)))
        # Read for a classic group too: what a consumer group left there is deleted with the group's next write.
        members = await self.meta.range(keys.group_members(group_id))
        now = time.time()
        group: Group | ConsumerGroup
        if record is None:
            group = Group(group_id, self.settings, now)
        elif is_consumer_group(record.value):
            group = load_consumer_group(group_id, record.value, [kv.value for kv in members],
                                        self.consumer_settings, now)
        else:
            group = load_group(group_id, record.value, self.settings, now)
        stored = {kv.key: kv.value for kv in [*([record] if record is not None else []), *members]}
        coordinator = GroupCoordinator(group, meta=self.meta, revision=revision, offsets=offsets,
                                       persisted=record is not None, on_dead=self._dropped, pending=pending,
                                       classic=self.settings, consumer=self.consumer_settings, stored=stored)
        if self.closed or not self.owns(group_id):
            raise MetadataStoreError("shard is stopping" if self.closed else f"group {group_id} moved away")
        self.groups[group_id] = coordinator
        coordinator.start()
        log.info("group %s loaded: %s %s, generation %d, %d members, %d offsets, %d open transactions", group_id,
                 group.group_type, group.state_name, group.generation, len(group.members), len(offsets), len(pending))
        return coordinator

    async def _take_epoch(self, group_id: str) -> int:
        key = keys.group_coordinator(group_id)
        for _ in range(20):
            current = await self.meta.get(key)
            epoch = current.value["epoch"] + 1 if current else 1
            seen = current.mod_revision if current else 0
            result = await self.meta.txn([Compare(key, "mod_revision", "==", seen)],
                                         [Put(key, {"epoch": epoch, "shard": self.shard_id})])
            if result.succeeded:
                return result.revision
        raise MetadataStoreError(f"could not take the coordinator key of group {group_id}: contended")

    def _dropped(self, coordinator: GroupCoordinator) -> None:
        if self.groups.get(coordinator.group_id) is coordinator:
            del self.groups[coordinator.group_id]

    async def _load_all(self) -> None:
        try:
            records = await self.meta.range(keys.GROUPS)
            for kv in records:
                group_id = unquote(kv.key[len(keys.GROUPS):])
                if self.owns(group_id) and group_id not in self.groups:
                    try:
                        await self.get(group_id)
                    except MetadataStoreError as e:
                        log.warning("group %s not loaded at start (loads on first use): %s", group_id, e)
        except MetadataStoreError as e:
            log.warning("stored groups not loaded at start (each loads on first use): %s", e)
        finally:
            self._loaded.set()

    def placement_changed(self) -> None:
        """Groups that moved away close here (their members get NOT_COORDINATOR and find the new shard, which
        takes the coordinator epoch, fencing anything this shard would still write). Stored groups that moved
        here load, so their sessions expire even if their members never come back."""
        if self.closed:
            return
        for group_id, coordinator in list(self.groups.items()):
            if not self.owns(group_id):
                del self.groups[group_id]
                self._spawn(coordinator.close())
        self._spawn(self._load_all())

    async def release_all(self) -> None:
        """Close every coordinator (this shard stops serving; it may load them again later)."""
        coordinators = list(self.groups.values())
        self.groups.clear()
        await asyncio.gather(*(c.close() for c in coordinators), return_exceptions=True)

    def _spawn(self, job: Awaitable[None]) -> None:
        task = asyncio.get_running_loop().create_task(job)  # type: ignore[arg-type]
        self._tasks.append(task)
        task.add_done_callback(self._tasks.remove)

    async def all_groups(self) -> list[GroupCoordinator]:
        """Every live group this shard coordinates (waits for the start-up load, as ListGroups must)."""
        await self._loaded.wait()
        return [c for c in self.groups.values() if c.group.state is not State.DEAD]

    async def _retention_loop(self) -> None:
        await self._loaded.wait()
        while True:
            await asyncio.sleep(self.retention_check_interval_s)
            await self.expire_offsets(int(time.time() * 1000))

    async def expire_offsets(self, now_ms: int, topics: set[str] | None = None) -> None:
        """Drop offsets past retention, and those of deleted topics (of `topics` only, when given)."""
        for coordinator in list(self.groups.values()):
            with contextlib.suppress(MetadataStoreError):
                live = await self.live_offsets(coordinator)
                gone = {tp for tp in coordinator.offsets if tp not in live and (topics is None or tp[0] in topics)}
                await coordinator.expire_offsets(now_ms, self.offsets_retention_ms, gone=gone)

    def topic_changed(self, name: str, old: TopicInfo | None, info: TopicInfo | None) -> None:
        """A TopicRegistry listener: a topic deleted (or replaced by a namesake) takes its offsets with it."""
        if info is None and not self.closed:
            self._spawn(self.expire_offsets(int(time.time() * 1000), {name}))

    async def live_offsets(self, coordinator: GroupCoordinator | None) -> dict[TopicPartition, OffsetEntry]:
        """The group's committed offsets of topics that exist now (not of a deleted topic, nor of its namesake)."""
        if coordinator is None:
            return {}
        if self.topic is None:
            return dict(coordinator.offsets)
        topics = {t: await self.topic(t) for t in {t for t, _ in coordinator.offsets}}
        return {tp: e for tp, e in coordinator.offsets.items() if e.belongs_to(topics[tp[0]])}

    async def complete_txn_offsets(self, group_id: str, producer_id: int, producer_epoch: int,
                                   commit: bool) -> ErrorCode:
        """A transaction's end (its coordinator calls this, and repeats it until it succeeds): the producer's
        pending TxnOffsetCommit offsets become the group's committed offsets, or are dropped. A group that does
        not exist (deleted, with its pending offsets) has nothing pending: success."""
        error, coordinator = await self.lookup(group_id)
        if error != ErrorCode.none or coordinator is None:
            return error
        return await coordinator.complete_txn(producer_id, producer_epoch, commit)

    async def unstable(self, group_id: str) -> tuple[ErrorCode, set[TopicPartition]]:
        """Partitions with offsets in an open transaction (OffsetFetch with require_stable), at the coordinator."""
        error, coordinator = await self.lookup(group_id)
        return error, pending_partitions(coordinator.pending) if coordinator is not None else set()

    async def committed(self, group_id: str) -> dict[TopicPartition, int]:
        live = await self.live_offsets(await self.get(group_id))
        return {tp: e.offset for tp, e in live.items()}


def consumer_group_settings(config: BrokerConfig) -> ConsumerSettings:
    return ConsumerSettings(session_timeout_ms=config.group_consumer_session_timeout_ms,
                            heartbeat_interval_ms=config.group_consumer_heartbeat_interval_ms,
                            assignors=tuple(config.consumer_assignors()), max_size=config.group_consumer_max_size)


def group_settings(config: BrokerConfig) -> GroupSettings:
    return GroupSettings(min_session_timeout_ms=config.group_min_session_timeout_ms,
                         max_session_timeout_ms=config.group_max_session_timeout_ms,
                         initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms)
