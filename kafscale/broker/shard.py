"""A shard's broker core: the partition owners and group coordinators it hosts, on one asyncio loop.

`ShardCore` is the `Broker` the Kafka front end talks to (kafscale.broker.interface) and plain Python: tests
drive it directly, and kafscale.actors composes it with a listener and operations. A partition or group that
lives on another shard is reached through a `Peer`, by the same typed calls.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from kio.schema.errors import ErrorCode

from kafscale.broker import housekeeping, janitor, log_dirs, retention, txn_markers, txn_produce
from kafscale.broker.cleaning import Offload, run_in_thread
from kafscale.broker.commit_batcher import CommitBatcher
from kafscale.broker.fetch import long_poll
from kafscale.broker.fetch_sessions import FetchSessionCache
from kafscale.broker.handoff import HandOffs
from kafscale.broker.interface import FetchItem, Peer, Peers, ProduceItem
from kafscale.broker.owners import OwnerTable
from kafscale.broker.packer import PhysicalPartition
from kafscale.broker.partition_owner import OwnerSettings, PartitionOwner
from kafscale.broker.produce import ProducePath
from kafscale.broker.results import (
    DeleteRecordsResult,
    FetchResult,
    GroupOffsets,
    OffsetResult,
    PartitionLag,
    ProduceResult,
)
from kafscale.broker.routing import Local, Refused, Remote, Route
from kafscale.broker.stats import NO_METRICS, BrokerMetrics, PartitionStats, ShardStats
from kafscale.broker.txn_admin import PartitionProducers, active_producers
from kafscale.cluster import ids
from kafscale.cluster.lease_renewal import RenewalThread
from kafscale.cluster.membership import BrokerRecord, Membership
from kafscale.cluster.placement import Placement, ShardAddress
from kafscale.cluster.topics import TopicInfo, TopicRegistry
from kafscale.cluster.virtual import VirtualMapping
from kafscale.config import BrokerConfig
from kafscale.groups.registry import GroupRegistry, consumer_group_settings, group_settings
from kafscale.security.acls import Acls
from kafscale.security.credentials import Credentials
from kafscale.storage.async_store import AsyncObjectStore
from kafscale.storage.cache import ByteLRU
from kafscale.storage.control import TxnMarker
from kafscale.storage.health import HealthState, HealthThresholds, HealthTracker
from kafscale.storage.metadata_store import MetadataStore
from kafscale.storage.object_store import ObjectStore
from kafscale.transactions.registry import TransactionRegistry, txn_settings

log = logging.getLogger(__name__)
T = TypeVar("T")
PROBE_INTERVAL_S = 0.5


class ShardCore:
    def __init__(self, shard_id: int, config: BrokerConfig, *, meta: MetadataStore, objects: ObjectStore,
                 shards: list[ShardAddress] | None = None, peers: Peers | None = None,
                 metrics: BrokerMetrics = NO_METRICS, renewals: RenewalThread | None = None,
                 offload: Offload = run_in_thread) -> None:
        self.shard_id = shard_id
        self.offload = offload  # where cleaning passes run (kafscale.broker.cleaning): a thread, or a Ray task
        self.config = config
        self.metrics = metrics
        self.meta = meta
        thresholds = HealthThresholds(
            degraded_latency_ms=config.s3_degraded_latency_ms,
            unavailable_latency_ms=config.s3_unavailable_latency_ms,
            degraded_error_rate=config.s3_degraded_error_rate,
            unavailable_error_rate=config.s3_unavailable_error_rate,
            window_s=config.s3_health_window_s,
        )
        self.objects = AsyncObjectStore(objects, health=HealthTracker(thresholds), observer=metrics.observe_s3)
        self.cache = ByteLRU(config.cache_bytes)
        self.cluster_id = ""
        self.placement = Placement(shard_id, shards, lone=peers is None)
        self.peers = peers  # None: a lone shard that serves every partition and group itself
        # In a cluster: this shard's lease and its view of the others (None: a lone shard)
        self.membership = (None if peers is None else
                           Membership(self.meta, self.placement, on_change=self._placement_changed,
                                      on_lost=self._lost_lease, resync=self._resync, renewals=renewals,
                                      lease_ttl_s=config.lease_ttl_s))
        self.credentials = Credentials(self.meta)  # SCRAM credentials, mirrored while a SASL listener needs them
        self._sasl = any(spec.sasl for spec in config.listener_specs())
        self.acls = Acls(self.meta, enabled=config.authorizer == "acl", super_users=tuple(config.super_user_list()),
                         allow_if_no_acl=config.allow_everyone_if_no_acl_found)
        self.handoffs = HandOffs()  # partitions released in planned moves, and lately moved away
        mapping = VirtualMapping.load(config.virtual_partitions_mapping) if config.virtual_partitions_mapping else None
        self.topics = TopicRegistry(self.meta, mapping)
        self.pack_segments = config.pack_segments
        settings = OwnerSettings(
            namespace=config.s3_namespace, segment_bytes=config.segment_bytes,
            flush_interval_ms=config.flush_interval_ms, blocked_flush_min_bytes=config.blocked_flush_min_bytes,
            index_interval_bytes=config.index_interval_bytes,
            max_pending_bytes=config.max_pending_bytes, readahead_segments=config.readahead_segments,
            uploads_in_flight=config.segment_uploads_in_flight,
        )
        self.owner_table = OwnerTable(shard_id, meta=self.meta, objects=self.objects, cache=self.cache,
                                      settings=settings, committer=CommitBatcher(self.meta), metrics=metrics,
                                      topic_configs=self._topic_configs, packs_of=self._packs_of)
        self.groups = GroupRegistry(shard_id, self.meta, group_settings(config), owns=self._coordinates,
                                    offsets_retention_ms=config.offsets_retention_minutes * 60_000,
                                    retention_check_interval_s=config.offsets_retention_check_interval_ms / 1000,
                                    topic=self.topics.get, consumer_settings=consumer_group_settings(config))
        self.transactions = TransactionRegistry(shard_id, self.meta, txn_settings(config), owns=self._coordinates,
                                                allocate_producer_id=self.allocate_producer_id,
                                                write_marker=self.write_txn_marker,
                                                complete_offsets=self.complete_txn_offsets, topic=self.topics.get)
        self.fetch_sessions = FetchSessionCache(config.max_incremental_fetch_session_cache_slots)
        self.topics.listeners += [self._topic_changed, self.groups.topic_changed]
        self.producer = ProducePath(self._ready_owner, self.route)
        self._background: list[asyncio.Task[None]] = []

    @property
    def owners(self) -> dict[tuple[str, int], PartitionOwner]:
        return self.owner_table.owners

    @property
    def _opening(self) -> dict[tuple[str, int], asyncio.Task[PartitionOwner]]:
        return self.owner_table.opening

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        self.cluster_id = await ids.cluster_id(self.meta)
        if self.membership is not None:
            await self.membership.load()  # who is live, before anything is opened or answered
        await self.topics.start()
        await self.groups.start()
        await self.transactions.start()
        if self._sasl:
            await self.credentials.start()
        await self.acls.start()  # before the listener: no request is answered without the ACLs in force
        loop = asyncio.get_running_loop()
        self._background += [loop.create_task(self.objects.warm_up()),
                             loop.create_task(self._probe_while_unhealthy()),
                             *(loop.create_task(chore) for chore in housekeeping.chores(self))]

    async def quiesce(self) -> None:
        """The first half of stopping, before the listener closes: nothing new opens, and waiting JoinGroups get
        NOT_COORDINATOR instead of holding the listener's stop."""
        await self.owner_table.cancel_early_opens()
        for task in self._background:
            task.cancel()
        self._background.clear()
        await self.groups.close()

    async def stop(self) -> None:
        """Flush every owner and release ownership (quiesces first if that has not happened)."""
        if not self.owner_table.closing:
            await self.quiesce()
        await self.transactions.close()  # before the owners close: no marker is written to a closing owner
        await self.owner_table.close()
        if self.membership is not None:  # after the flush: a successor must not fence our last commits
            await self.membership.stop()
        log.info("shard %d stopping: topic watch", self.shard_id)
        await self.topics.stop()
        await self.credentials.stop()
        await self.acls.stop()
        self.objects.close()
        log.info("shard %d stopped", self.shard_id)

    async def probe_object_store(self) -> None:
        """One HEAD through the shard's store, so the S3 health tracker sees it (also /readyz's check)."""
        await self.objects.head(f"{self.config.s3_namespace}/__health/probe")

    async def _probe_while_unhealthy(self) -> None:
        """Refused produces and fetches make no calls, so without probes the health window would only
        notice a recovery by ageing out."""
        while True:
            await asyncio.sleep(PROBE_INTERVAL_S)
            if self.objects.state() != HealthState.HEALTHY:
                try:
                    await self.probe_object_store()
                except Exception as e:
                    log.debug("object store probe failed: %s", e)

    def stats(self) -> ShardStats:
        return ShardStats(
            shard_id=self.shard_id, shards=len(self.placement.shards), cache_hits=self.cache.hits,
            cache_misses=self.cache.misses, cache_bytes=self.cache.size, s3_state=int(self.objects.state()),
            group_coordinators=len(self.groups.groups),
            partitions=tuple(PartitionStats(t, p, o.high_watermark, o.log_start_offset, o.bytes_in, o.bytes_out,
                                            self._unit_of(t, p))
                             for (t, p), o in list(self.owners.items())),
            fetch_sessions=len(self.fetch_sessions), fetch_session_partitions=self.fetch_sessions.partitions_cached(),
            fetch_session_evictions=self.fetch_sessions.evictions)

    def _packs_of(self, topic: str, partition: int) -> PhysicalPartition | None:
        """Which partitions' segments share this one's packs: a virtual partition's physical partition, or a plain
        topic's partitions (`pack_segments`); None: its segments are objects of their own."""
        info = self.topics.topics.get(topic)
        if info is None:
            return None
        if not info.physical:
            return PhysicalPartition(None, list(range(info.partitions)), (0, info.partitions)) if self.pack_segments \
                else None
        unit = info.unit_of(partition)
        return PhysicalPartition(unit, info.lanes(unit), (info.physical, info.partitions))

    def _unit_of(self, topic: str, partition: int) -> int:
        info = self.topics.topics.get(topic)
        return info.unit_of(partition) if info is not None else partition

    def _topic_changed(self, name: str, old: TopicInfo | None, info: TopicInfo | None) -> None:
        """A deleted (or re-created) topic: its owners here stop. A partition moved away: its owner flushes
        what it holds (a successor's new epoch fences it if that is too late) and stops. New partitions, or
        partitions moved here: they open now."""
        same = old is not None and info is not None and old.id == info.id
        self.owner_table.drop(name, lambda p: info is not None and p < info.partitions and self._leads(info, p),
                              flush=same)
        if info is None:
            return
        if same and old is not None:
            for p in range(min(old.partitions, info.partitions)):
                if old.placement[p] == self.shard_id and info.placement[p] != self.shard_id:
                    self.handoffs.moved((name, p))
        for t, p in list(self.handoffs.released):
            if t == name and (not same or p >= info.partitions or info.placement[p] != self.shard_id):
                self.handoffs.settled((t, p))
        self.owner_table.open_early(name, [p for p in range(info.partitions) if self._leads(info, p) and not (
            same and old is not None and p < old.partitions and self._leads(old, p))])

    def _placement_changed(self) -> None:
        """The live shards or the group slot map changed (kafscale.cluster.membership)."""
        self.groups.placement_changed()
        self.transactions.placement_changed()

    async def _lost_lease(self) -> None:
        """The lease may lapse any moment now, and a successor be named: stop serving everything."""
        self.owner_table.drop_all()
        await self.groups.release_all()
        await self.transactions.release_all()

    async def _resync(self) -> None:
        await self.topics.resync()

    async def join(self, record: BrokerRecord) -> None:
        """Register in the cluster (a lone shard has nothing to join); from now on it serves what it leads."""
        if self.membership is not None:
            await self.membership.start(record)
            self._placement_changed()
            for info in list(self.topics.topics.values()):
                self.owner_table.open_early(info.name, [p for p in range(info.partitions) if self._leads(info, p)])

    async def release(self, topic: str, partition: int) -> int:
        """A planned move's first half: stop taking appends, flush and commit, let go. Returns the end offset
        committed (-1: not led here). Requests get NOT_LEADER_OR_FOLLOWER until placement names the successor.
        A virtual partition's physical partition goes as a whole: all of its virtual partitions are let go."""
        info = self.topics.topics.get(topic)
        if info is None or partition >= info.partitions or not self._leads(info, partition):
            return -1
        lanes = info.lanes(info.unit_of(partition))  # a physical partition's virtual partitions go together
        for lane in lanes:
            self.handoffs.release((topic, lane))
        owners = dict(zip(lanes, await asyncio.gather(*(self.owner_table.release(topic, lane) for lane in lanes)),
                          strict=True))
        owner = owners[partition]
        return owner.high_watermark if owner is not None else -1

    def _topic_configs(self, topic: str) -> dict[str, Any]:
        info = self.topics.topics.get(topic)
        return info.configs if info else {}

    # ---------------------------------------------------------------- placement and routing

    def _serving(self) -> bool:
        return self.membership is None or self.membership.serving

    def _leads(self, info: TopicInfo, partition: int) -> bool:
        if self.handoffs.released and (info.name, partition) in self.handoffs.released:  # no tuple per produce
            return False
        return self.placement.leads(info, partition) and self._serving()

    def _coordinates(self, group_id: str) -> bool:
        return self.placement.coordinates(group_id) and self._serving()

    async def owner(self, topic: str, partition: int) -> PartitionOwner:
        """The local owner, opened on first use."""
        return await self.owner_table.get(topic, partition)

    async def route(self, topic: str, partition: int, deadline: float | None = None) -> Route:
        """Where a partition's request goes: its owner here (opened if needed), the shard that leads it, or
        the error to answer. An open that outlasts the deadline (event loop time) is REQUEST_TIMED_OUT; it
        goes on (shielded), so a retry finds it done."""
        waited = self.handoffs.holds((topic, partition))
        if waited:  # requests wait out a hand-off, then go to the successor (kafscale.broker.handoff)
            await self.handoffs.wait((topic, partition), deadline)
        info = await self.topics.get(topic)
        if info is None or not 0 <= partition < info.partitions:
            return Refused(ErrorCode.unknown_topic_or_partition)
        if not self._leads(info, partition):
            leader = self.placement.leader_of(info, partition)
            if self.peers is None or leader == self.shard_id or not self.placement.live(leader):
                return Refused(ErrorCode.not_leader_or_follower)  # not serving, handed off, or its shard is gone
            if not waited and self.handoffs.moved_lately((topic, partition)):
                return Refused(ErrorCode.not_leader_or_follower)  # the client must learn the new leader
            return Remote(self.peers(leader), leader)
        try:
            if deadline is None:
                return Local(await self.owner(topic, partition))
            remaining = max(deadline - asyncio.get_running_loop().time(), 0.001)
            return Local(await asyncio.wait_for(self.owner(topic, partition), timeout=remaining))
        except TimeoutError:
            return Refused(ErrorCode.request_timed_out)
        except Exception as e:  # the store is down, or a successor fenced the open: the client retries
            log.warning("cannot open %s-%d: %s", topic, partition, e)
            return Refused(ErrorCode.not_leader_or_follower)

    # ---------------------------------------------------------------- produce (kafscale.broker.produce)

    def start_produce(self, items: list[ProduceItem], acks: int, timeout_ms: int,
                      then: Callable[[list[ProduceResult]], T],
                      transactional_id: str | None = None, add_to_txn: bool = False) -> asyncio.Future[T]:
        if transactional_id is not None:
            return txn_produce.start(self, transactional_id, items, acks, timeout_ms, then, add_to_txn)
        return self.producer.start(items, acks, timeout_ms, then)

    def flush_now(self, partitions: Iterable[tuple[str, int]], producer_id: int) -> None:
        for topic, partition in partitions:
            owner = self._ready_owner(topic, partition)
            if owner is not None:
                owner.flush_now(producer_id)

    async def produce(self, topic: str, partition: int, records: bytes | bytearray, acks: int,
                      timeout_ms: int) -> ProduceResult:
        return await self.producer.produce(topic, partition, records, acks, timeout_ms)

    async def produce_many(self, items: list[ProduceItem], acks: int, timeout_ms: int) -> list[ProduceResult]:
        return await self.start_produce(items, acks, timeout_ms, lambda results: results)

    def leads(self, topic: str, partition: int) -> bool:
        """Whether this shard serves the partition now, by what it knows without a wait."""
        info = self.topics.topics.get(topic)
        return info is not None and 0 <= partition < info.partitions and self._leads(info, partition)

    def _ready_owner(self, topic: str, partition: int) -> PartitionOwner | None:
        """The open owner of a partition this shard leads, without a wait; None if there is none yet."""
        return self.owner_table.ready((topic, partition)) if self.leads(topic, partition) else None

    async def log_dir(self, wanted: log_dirs.Wanted | None) -> log_dirs.LogDir:
        """DescribeLogDirs: the partitions this shard leads among `wanted` (None: all), with their sizes."""
        return await log_dirs.describe(self, wanted)

    # ---------------------------------------------------------------- fetch, offsets, records

    async def fetch(self, parts: list[FetchItem], max_wait_ms: int, min_bytes: int, max_bytes: int,
                    isolation_level: int = 0) -> list[FetchResult]:
        """Long-poll read of (topic, partition, offset, partition_max_bytes) items, in request order;
        isolation_level 1 (read_committed) reads up to each partition's last stable offset."""
        results: list[FetchResult | None] = [None] * len(parts)
        local: dict[int, PartitionOwner] = {}
        remote: dict[int, tuple[Peer, list[int]]] = {}
        for i, (topic, partition, _, _) in enumerate(parts):
            ready = self._ready_owner(topic, partition)  # the usual case: led here and open, no wait
            if ready is not None:
                local[i] = ready
                continue
            where = await self.route(topic, partition)
            if isinstance(where, Local):
                local[i] = where.owner
            elif isinstance(where, Remote):
                remote.setdefault(where.shard, (where.peer, []))[1].append(i)
            else:
                results[i] = FetchResult(int(where.error))
        forwarded = {shard: asyncio.ensure_future(peer.fetch([parts[i] for i in idx], max_wait_ms, min_bytes,
                                                             max_bytes, isolation_level))
                     for shard, (peer, idx) in remote.items()}
        for i, result in (await long_poll(local, parts, max_wait_ms, min_bytes, max_bytes, self.metrics,
                                          isolation_level)).items():
            results[i] = result
        for shard, call in forwarded.items():
            indexes = remote[shard][1]
            try:
                answers = await call
            except Exception as e:
                log.warning("forwarded fetch to shard %d failed: %s", shard, e)
                answers = [FetchResult(int(ErrorCode.not_leader_or_follower)) for _ in indexes]
            for i, answer in zip(indexes, answers, strict=True):
                results[i] = answer
        return [r if r is not None else FetchResult(int(ErrorCode.unknown_server_error)) for r in results]

    async def list_offset(self, topic: str, partition: int, timestamp: int,
                          isolation_level: int = 0) -> OffsetResult:
        """ListOffsets: latest (-1; read_committed: the last stable offset), earliest (-2), max timestamp (-3),
        or the first offset at a timestamp."""
        where = await self.route(topic, partition)
        if isinstance(where, Refused):
            return OffsetResult(int(where.error))
        if isinstance(where, Remote):
            return await where.peer.list_offset(topic, partition, timestamp, isolation_level)
        owner = where.owner
        if timestamp == -1:
            return OffsetResult(0, owner.last_stable_offset if isolation_level else owner.high_watermark)
        if timestamp == -2:
            return OffsetResult(0, owner.log_start_offset)
        try:
            if timestamp == -3:
                found = await owner.reader.max_timestamp_offset()
            else:
                found = await owner.reader.offset_for_timestamp(timestamp)
        except Exception as e:
            log.warning("timestamp lookup on %s-%d failed: %s", topic, partition, e)
            return OffsetResult(int(ErrorCode.kafka_storage_error))
        if found is None:  # no record at or after the time; for -3, no record at all: Kafka answers -1 for both
            return OffsetResult(0, -1)
        return OffsetResult(0, found[0], found[1])

    async def delete_records(self, topic: str, partition: int, offset: int) -> DeleteRecordsResult:
        """DeleteRecords for one partition: its log start moves to offset (-1: the high watermark)."""
        where = await self.route(topic, partition)
        if isinstance(where, Refused):
            return DeleteRecordsResult(int(where.error))
        if isinstance(where, Remote):
            return await where.peer.delete_records(topic, partition, offset)
        return await retention.delete_records(where.owner, offset, self.owners)

    # ---------------------------------------------------------------- topics, producer ids, groups

    async def delete_topic(self, name: str) -> bool:
        if not await self.topics.delete(name):
            return False
        try:
            await janitor.delete_topic_objects(self.meta, self.objects, self.config.s3_namespace, name)
        except Exception as e:  # metadata is gone, so leftovers are never served; the janitor finishes later
            log.warning("topic %s deleted but removing its objects failed (the janitor will): %s", name, e)
        return True

    async def allocate_producer_id(self) -> int:
        return await ids.allocate_producer_id(self.meta)

    # ---------------------------------------------------------------- transactions (kafscale.transactions)

    async def write_txn_marker(self, topic: str, partition: int, marker: TxnMarker, timeout_ms: int) -> int:
        return await txn_markers.write(self, topic, partition, marker, timeout_ms)

    async def describe_producers(self, topic: str, partition: int) -> PartitionProducers:
        """DescribeProducers, at the partition's owner (a hop to its shard when it is elsewhere)."""
        where = await self.route(topic, partition)
        if isinstance(where, Refused):
            return PartitionProducers(int(where.error))
        if isinstance(where, Remote):
            return await where.peer.describe_producers(topic, partition)
        return PartitionProducers(0, active_producers(where.owner.producers))

    async def verify_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                         partitions: list[tuple[str, int]], group_id: str | None = None,
                         add: bool = False) -> list[int]:
        """At the transaction's coordinator (a hop to its shard when it is elsewhere)."""
        if not self._coordinates(transactional_id) and self.peers is not None:
            shard = self.placement.coordinator_of(transactional_id)
            if shard == self.shard_id or not self.placement.live(shard):
                return [int(ErrorCode.coordinator_not_available)] * (len(partitions) + (group_id is not None))
            return await self.peers(shard).verify_txn(transactional_id, producer_id, producer_epoch, partitions,
                                                      group_id, add)
        return await self.transactions.verify_or_add(transactional_id, producer_id, producer_epoch, partitions,
                                                     group_id, add)

    async def complete_txn_offsets(self, group_id: str, producer_id: int, producer_epoch: int, commit: bool) -> int:
        """At the group's coordinator (a hop to its shard when it is elsewhere)."""
        if not self._coordinates(group_id) and self.peers is not None:
            shard = self.placement.coordinator_of(group_id)
            if shard == self.shard_id or not self.placement.live(shard):
                return int(ErrorCode.coordinator_not_available)
            return await self.peers(shard).complete_txn_offsets(group_id, producer_id, producer_epoch, commit)
        return int(await self.groups.complete_txn_offsets(group_id, producer_id, producer_epoch, commit))

    async def group_offsets(self, group_id: str, forwarded: bool = False) -> GroupOffsets:
        """The group's committed offsets (OffsetFetch). A shard asked for a group it does not coordinate (the
        client's coordinator has just moved) asks the one that does, once: librdkafka's admin client crashes
        on a NOT_COORDINATOR answer to OffsetFetch (librdkafka#5040), and a read loses nothing by one hop."""
        error, coordinator = await self.groups.lookup(group_id)
        if error == ErrorCode.not_coordinator and not forwarded and self.peers is not None:
            shard = self.placement.coordinator_of(group_id)
            if shard != self.shard_id and self.placement.live(shard):
                try:
                    return await self.peers(shard).group_offsets(group_id, forwarded=True)
                except Exception as e:  # the coordinator is going away: the client asks again
                    log.warning("offsets of group %s not fetched from shard %d: %s", group_id, shard, e)
        if error != ErrorCode.none:
            return GroupOffsets(error)
        return GroupOffsets(ErrorCode.none, await self.groups.live_offsets(coordinator))

    async def group_lag(self, group_id: str) -> list[PartitionLag]:
        """Per partition the group committed to: committed offset, high watermark, lag (metrics and the CLI).
        Asked of the group's coordinator; high watermarks come from the partitions' owners."""
        if not self._coordinates(group_id):
            assert self.peers is not None
            return await self.peers(self.placement.coordinator_of(group_id)).group_lag(group_id)
        committed = await self.groups.committed(group_id)
        parts = sorted(committed)
        ends = await asyncio.gather(*(self.list_offset(t, p, -1) for t, p in parts))
        out = []
        for (topic, partition), end in zip(parts, ends, strict=True):
            hwm = end.offset if end.error == 0 else -1
            offset = committed[(topic, partition)]
            out.append(PartitionLag(topic, partition, offset, hwm, max(hwm - offset, 0) if hwm >= 0 else None))
        return out
