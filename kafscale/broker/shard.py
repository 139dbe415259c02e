"""A broker shard: one acceptor plus the partition owners it hosts, all on one asyncio loop.

`ShardCore` is plain Python (the tests drive it directly); `ShardActor` (kafscale.runtime.shard_actor)
hosts it in a Ray worker process. Requests for partitions owned by another shard are forwarded to
that shard through Ray: slower, still correct.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from kio.schema.errors import ErrorCode

from kafscale.broker import retention
from kafscale.broker.commit_batcher import CommitBatcher
from kafscale.broker.partition_owner import (
    AppendOutcome,
    FencedError,
    OwnerSettings,
    PartitionOwner,
)
from kafscale.broker.produce_wait import DurableWait, wait_durable
from kafscale.cluster import keys
from kafscale.cluster.topics import TopicInfo, TopicRegistry
from kafscale.config import BrokerConfig
from kafscale.groups import registry as group_registry
from kafscale.ops.http import MetricsServer, metrics_address
from kafscale.ops.lag import LagSampler
from kafscale.ops.metrics import ShardMetrics, TimedMetadataStore
from kafscale.server.listener import Listener
from kafscale.server.router import Router
from kafscale.storage.async_store import AsyncObjectStore
from kafscale.storage.cache import ByteLRU
from kafscale.storage.health import HealthState, HealthThresholds, HealthTracker
from kafscale.storage.metadata_store import Compare, MetadataStore, MetadataStoreError, Put
from kafscale.storage.object_store import ObjectStore

log = logging.getLogger(__name__)
T = TypeVar("T")
PROBE_INTERVAL_S = 0.5
# A new topic's partitions open at creation when the shard hosts at most EARLY_OPEN_MAX of them: a
# 10,000-partition topic opens on first use instead of as a burst of metadata transactions. Early opens
# take at most EARLY_OPENS_AT_ONCE of the OPENS_AT_ONCE slots below, so that opens a client is waiting
# for are not queued behind many topics created together.
EARLY_OPEN_MAX = 64
EARLY_OPENS_AT_ONCE = 8
OPEN_ON_STOP_S = 10.0  # how long stop() waits for owners still opening (metadata store slow or down)
# Opens in progress at once, whatever asks for them: a client touching thousands of unopened partitions
# (or every partition of a restarted shard) queues here instead of starting thousands of epoch
# transactions together. Enough to keep the metadata store's group commits full.
OPENS_AT_ONCE = 64


@dataclass(frozen=True, slots=True)
class ShardAddress:
    id: int
    host: str
    port: int


# A forwarder sends a call to another shard: (shard_id, method name, args) -> result.
Forwarder = Callable[[int, str, tuple[Any, ...]], Awaitable[Any]]


class ShardCore:
    def __init__(
        self,
        shard_id: int,
        config: BrokerConfig,
        *,
        meta: MetadataStore,
        objects: ObjectStore,
        shards: list[ShardAddress] | None = None,
        forward: Forwarder | None = None,
    ) -> None:
        self.shard_id = shard_id
        self.config = config
        self.metrics = ShardMetrics(self)
        self.meta: MetadataStore = TimedMetadataStore(meta, self.metrics)
        thresholds = HealthThresholds(
            degraded_latency_ms=config.s3_degraded_latency_ms,
            unavailable_latency_ms=config.s3_unavailable_latency_ms,
            degraded_error_rate=config.s3_degraded_error_rate,
            unavailable_error_rate=config.s3_unavailable_error_rate,
            window_s=config.s3_health_window_s,
        )
        self.objects = AsyncObjectStore(objects, health=HealthTracker(thresholds), observer=self.metrics.observe_s3)
        self.cache = ByteLRU(config.cache_bytes)
        self.topics = TopicRegistry(self.meta)
        self.topics.listeners.append(self._topic_changed)
        self.shards = shards or []
        self.forward = forward
        self.owners: dict[tuple[str, int], PartitionOwner] = {}
        self._opening: dict[tuple[str, int], asyncio.Task[PartitionOwner]] = {}
        self._append_locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._queued: dict[tuple[str, int], int] = {}  # produce() calls not yet past their append
        self._early_opens: set[asyncio.Task[None]] = set()  # owners of new partitions, opened before use
        self._early_open_slots = asyncio.Semaphore(EARLY_OPENS_AT_ONCE)
        self._open_slots = asyncio.Semaphore(OPENS_AT_ONCE)
        self._stopping = False
        self.cluster_id = ""
        self.router = Router()
        self.router.observe = self.metrics.observe_request
        self._background: list[asyncio.Task[None]] = []
        self.metrics_server: MetricsServer | None = None
        host, port = config.listen_host_port()
        if self.shards:
            port = self.shards[shard_id].port
        self.listener = Listener(self.router, host, port, max_frame_bytes=config.max_frame_bytes,
                                 advertised_host=config.advertised_host or None,
                                 max_in_flight=config.max_in_flight_requests,
                                 max_in_flight_bytes=config.max_in_flight_bytes,
                                 idle_timeout_s=config.connections_max_idle_ms / 1000)
        self.owner_settings = OwnerSettings(
            namespace=config.s3_namespace, segment_bytes=config.segment_bytes,
            flush_interval_ms=config.flush_interval_ms, index_interval_bytes=config.index_interval_bytes,
            max_pending_bytes=config.max_pending_bytes, readahead_segments=config.readahead_segments,
            uploads_in_flight=config.segment_uploads_in_flight,
        )
        self.groups = group_registry.for_shard(self)  # the group coordinators this shard hosts
        self.committer = CommitBatcher(self.meta)  # the owners' flush commits share metadata transactions

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> ShardAddress:
        from kafscale.server.handlers.registry import register_all

        self.cluster_id = await self._cluster_id()
        await self.topics.start()
        register_all(self.router, self)
        await self.listener.start()
        if not self.shards:
            # Single-shard use (tests, one process): this shard is the whole cluster.
            self.shards = [ShardAddress(self.shard_id, self.advertised_host(), self.listener.port)]
        log.info("shard %d listening on %s:%d", self.shard_id, self.listener.host, self.listener.port)
        await self.groups.start()
        await self._start_operations()
        return ShardAddress(self.shard_id, self.advertised_host(), self.listener.port)

    def advertised_host(self) -> str:
        return self.config.advertised_host or self.listener.host

    async def stop(self) -> None:
        """Stop accepting, flush every owner, release ownership."""
        log.info("shard %d stopping: closing listener", self.shard_id)
        self._stopping = True
        for task in self._early_opens:
            task.cancel()
        await asyncio.gather(*self._early_opens, return_exceptions=True)
        await self._stop_operations()
        await self.groups.close()  # waiting JoinGroups get NOT_COORDINATOR instead of holding the listener's stop
        await self.listener.stop()
        # Let opens in progress finish (or give up) so that no owner appears after the flush below.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*self._opening.values(), return_exceptions=True), OPEN_ON_STOP_S)
        log.info("shard %d stopping: flushing %d partitions", self.shard_id, len(self.owners))
        await asyncio.gather(*(o.close(flush=True) for o in self.owners.values()), return_exceptions=True)
        self.owners.clear()
        log.info("shard %d stopping: topic watch", self.shard_id)
        await self.topics.stop()
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
                with contextlib.suppress(Exception):
                    await self.probe_object_store()

    async def _start_operations(self) -> None:
        """The object store's warm-up, retention, lag sampling and S3 probe loops, and the metrics/health endpoint
        (kafscale.broker.retention, kafscale.ops.lag, kafscale.ops.http)."""
        interval = self.config.retention_check_interval_ms / 1000
        self.lag_sampler = LagSampler(self)
        loop = asyncio.get_running_loop()
        self._background += [loop.create_task(self.objects.warm_up()),
                             loop.create_task(retention.run(lambda: self.owners.values(), interval)),
                             loop.create_task(self.lag_sampler.run()),
                             loop.create_task(self._probe_while_unhealthy())]
        address = metrics_address(self.config.metrics_listen, self.shard_id)
        if address is not None:
            self.metrics_server = MetricsServer(self, *address)
            await self.metrics_server.start()

    async def _stop_operations(self) -> None:
        for task in self._background:
            task.cancel()
        self._background.clear()
        if self.metrics_server is not None:
            await self.metrics_server.stop()

    async def _cluster_id(self) -> str:
        kv = await self.meta.get(keys.CLUSTER)
        if kv is None:
            await self.meta.txn([Compare(keys.CLUSTER, "version", "==", 0)],
                                [Put(keys.CLUSTER, {"cluster_id": uuid.uuid4().hex[:22]})])
            kv = await self.meta.get(keys.CLUSTER)
        assert kv is not None
        return str(kv.value["cluster_id"])

    def _topic_changed(self, name: str, old: TopicInfo | None, info: TopicInfo | None) -> None:
        """A deleted (or re-created) topic: its owners here stop, their cache entries go. A new topic
        (or new partitions): the partitions placed here open now, as Kafka's leaders do on creation,
        so that the first produce does not wait for the open."""
        for (topic, partition), owner in list(self.owners.items()):
            if topic == name and (info is None or partition >= info.partitions
                                  or info.placement[partition] != self.shard_id):
                self.owners.pop((topic, partition), None)
                owner.reader.forget()
                asyncio.get_running_loop().create_task(owner.close(flush=False))
        if info is not None and not self._stopping:
            first = old.partitions if old is not None and old.id == info.id else 0
            new = [p for p in range(first, info.partitions) if self.is_local(info, p)]
            for partition in new if len(new) <= EARLY_OPEN_MAX else []:
                task = asyncio.get_running_loop().create_task(self._open_early(name, partition))
                self._early_opens.add(task)
                task.add_done_callback(self._early_opens.discard)

    async def _open_early(self, topic: str, partition: int) -> None:
        async with self._early_open_slots:
            if self._stopping or (topic, partition) in self.owners:
                return
            try:
                await self.owner(topic, partition)
            except Exception as e:  # the first produce opens it (and reports the error) instead
                log.info("early open of %s-%d failed: %s", topic, partition, e)

    # ---------------------------------------------------------------- ownership

    def leader_of(self, info: TopicInfo, partition: int) -> int:
        return info.placement[partition] % max(len(self.shards), 1)

    def is_local(self, info: TopicInfo, partition: int) -> bool:
        return self.leader_of(info, partition) == self.shard_id or self.forward is None

    async def owner(self, topic: str, partition: int) -> PartitionOwner:
        """The local owner, opened (state recovered, epoch taken) on first use."""
        key = (topic, partition)
        owner = self.owners.get(key)
        if owner is not None and not owner.fenced:
            return owner
        task = self._opening.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._open_owner(topic, partition))
            self._opening[key] = task
            task.add_done_callback(lambda _t: self._opening.pop(key, None))
        return await asyncio.shield(task)

    async def _open_owner(self, topic: str, partition: int) -> PartitionOwner:
        old = self.owners.pop((topic, partition), None)
        if old is not None:
            await old.close(flush=False)
        owner = PartitionOwner(topic, partition, shard_id=self.shard_id, meta=self.meta, objects=self.objects,
                               cache=self.cache, settings=self.owner_settings,
                               topic_config=lambda: self._topic_configs(topic), metrics=self.metrics.partition(topic),
                               committer=self.committer)
        async with self._open_slots:
            await owner.open()
        self.owners[(topic, partition)] = owner
        return owner

    def _topic_configs(self, topic: str) -> dict[str, Any]:
        info = self.topics.topics.get(topic)
        return info.configs if info else {}

    # ---------------------------------------------------------------- partition operations
    # Each returns plain values so the same call works locally and forwarded through Ray.

    def start_produce(self, items: list[tuple[str, int, bytearray]], acks: int, timeout_ms: int,
                      then: Callable[[list[dict[str, Any]]], T]) -> asyncio.Future[T]:
        """One Produce request's partitions: a future of then(results), results in request order. Each
        partition takes the fast path (try_produce) where it can and queues behind the partition's lock
        otherwise. When every partition took the fast path (the steady state) no task runs: the future
        completes from the owners' durability callbacks (acks=all) or at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_ms, 1) / 1000
        results: list[dict[str, Any]] = [{} for _ in items]
        durable: dict[asyncio.Future[None], dict[str, Any]] = {}
        queued: dict[int, asyncio.Task[tuple[dict[str, Any], asyncio.Future[None] | None]]] = {}
        try:
            for i, (topic, partition, records) in enumerate(items):
                hit = self.try_produce(topic, partition, records, acks)
                if hit is None:
                    queued[i] = self._queue_append(topic, partition, records, acks, deadline)
                    continue
                results[i], fut = hit
                if fut is not None and acks == -1 and results[i]["error"] == 0:
                    durable[fut] = results[i]
        except BaseException:
            for task in queued.values():
                task.cancel()
            raise
        if queued:
            return loop.create_task(self._produce_rest(queued, results, durable, acks, deadline, then))
        if durable:
            return DurableWait(loop, durable, deadline, lambda: then(results)).future
        done: asyncio.Future[T] = loop.create_future()
        done.set_result(then(results))
        return done

    async def produce_many(self, items: list[tuple[str, int, bytearray]], acks: int,
                           timeout_ms: int) -> list[dict[str, Any]]:
        return await self.start_produce(items, acks, timeout_ms, lambda results: results)

    async def _produce_rest(self, queued: dict[int, asyncio.Task[tuple[dict[str, Any], asyncio.Future[None] | None]]],
                            results: list[dict[str, Any]], durable: dict[asyncio.Future[None], dict[str, Any]],
                            acks: int, deadline: float, then: Callable[[list[dict[str, Any]]], T]) -> T:
        appended = await asyncio.gather(*queued.values())
        for i, (result, fut) in zip(queued, appended, strict=True):
            results[i] = result
            if fut is not None and acks == -1 and result["error"] == 0:
                durable[fut] = result
        await wait_durable(durable, deadline)
        return then(results)

    def try_produce(self, topic: str, partition: int, records: bytes | bytearray,
                    acks: int) -> tuple[dict[str, Any], asyncio.Future[None] | None] | None:
        """The produce path without a wait, for a partition that is local and open, has buffer room
        and has no earlier request still queued in produce(). None: nothing done, use produce()."""
        key = (topic, partition)
        if key in self._queued:
            return None
        info = self.topics.topics.get(topic)
        if info is None or not 0 <= partition < info.partitions or not self.is_local(info, partition):
            return None
        owner = self.owners.get(key)
        if owner is None or owner.fenced:
            return None
        outcome = owner.try_append(records, acks=acks)
        if outcome is None:
            return None
        return _append_result(outcome), outcome.durable

    async def produce(self, topic: str, partition: int, records: bytes | bytearray, acks: int,
                      timeout_ms: int) -> dict[str, Any]:
        """One partition's records through the queue (also the call other shards forward)."""
        # The request timeout bounds the whole request: queueing, opening the owner, back-pressure
        # and the wait for durability, so that a sick store gets a retriable answer in time.
        deadline = asyncio.get_running_loop().time() + max(timeout_ms, 1) / 1000
        result, durable = await self._queue_append(topic, partition, records, acks, deadline)
        if durable is not None and acks == -1 and result["error"] == 0:
            await wait_durable({durable: result}, deadline)
        return result

    def _queue_append(self, topic: str, partition: int, records: bytes | bytearray, acks: int,
                      deadline: float) -> asyncio.Task[tuple[dict[str, Any], asyncio.Future[None] | None]]:
        """Mark the partition queued now, so that no later request takes the fast path past this one, and
        append behind its lock in a task. The mark goes when the task ends, however it ends: also when it
        is cancelled before its first step (its connection went away)."""
        key = (topic, partition)
        self._enter_queue(key)
        task = asyncio.get_running_loop().create_task(self._append_in_order(topic, partition, records, acks,
                                                                            deadline))
        task.add_done_callback(lambda _: self._leave_queue(key))
        return task

    def _enter_queue(self, key: tuple[str, int]) -> None:
        self._queued[key] = self._queued.get(key, 0) + 1

    def _leave_queue(self, key: tuple[str, int]) -> None:
        if self._queued[key] == 1:
            del self._queued[key]
        else:
            self._queued[key] -= 1

    async def _append_in_order(self, topic: str, partition: int, records: bytes | bytearray, acks: int,
                               deadline: float) -> tuple[dict[str, Any], asyncio.Future[None] | None]:
        # Offsets must follow arrival order. asyncio.Lock is FIFO, so holding it from arrival until
        # the owner has assigned offsets keeps a request that came later (e.g. while the owner was
        # still opening) from overtaking an earlier one; _queued keeps try_produce from doing so.
        key = (topic, partition)
        lock = self._append_locks.get(key)
        if lock is None:
            lock = self._append_locks[key] = asyncio.Lock()
        async with lock:
            return await self._append(topic, partition, records, acks, deadline)

    async def _append(self, topic: str, partition: int, records: bytes | bytearray, acks: int,
                      deadline: float) -> tuple[dict[str, Any], asyncio.Future[None] | None]:
        info = await self.topics.get(topic)
        if info is None or not 0 <= partition < info.partitions:
            return {"error": int(ErrorCode.unknown_topic_or_partition)}, None
        if not self.is_local(info, partition):
            # The owning shard applies the acks rule and the request timeout itself.
            forwarded = self._forward(self.leader_of(info, partition), "produce",
                                      (topic, partition, records, acks, self._ms_left(deadline)))
            return await forwarded, None
        try:
            remaining = deadline - asyncio.get_running_loop().time()
            owner = await asyncio.wait_for(self.owner(topic, partition), timeout=max(remaining, 0.001))
        except TimeoutError:  # the open goes on (it is shielded); a retry finds it done
            return {"error": int(ErrorCode.request_timed_out)}, None
        except (MetadataStoreError, FencedError, OSError) as e:
            log.warning("cannot open %s-%d: %s", topic, partition, e)
            return {"error": int(ErrorCode.not_leader_or_follower)}, None
        outcome = await owner.append(records, acks=acks, deadline=deadline)
        return _append_result(outcome), outcome.durable

    @staticmethod
    def _ms_left(deadline: float) -> int:
        return max(int((deadline - asyncio.get_running_loop().time()) * 1000), 1)

    async def fetch(self, parts: list[tuple[str, int, int, int]], max_wait_ms: int, min_bytes: int,
                    max_bytes: int) -> list[dict[str, Any]]:
        """Long-poll read of (topic, partition, offset, partition_max_bytes) items, in request order."""
        results: list[dict[str, Any] | None] = [None] * len(parts)
        local: list[int] = []
        remote: dict[int, list[int]] = {}
        for i, (topic, partition, _, _) in enumerate(parts):
            info = await self.topics.get(topic)
            if info is None or not 0 <= partition < info.partitions:
                results[i] = {"error": int(ErrorCode.unknown_topic_or_partition), "hwm": -1, "log_start": -1}
            elif self.is_local(info, partition):
                local.append(i)
            else:
                remote.setdefault(self.leader_of(info, partition), []).append(i)

        remote_calls = {
            shard: asyncio.ensure_future(self._forward(shard, "fetch", ([parts[i] for i in idx], max_wait_ms,
                                                                        min_bytes, max_bytes)))
            for shard, idx in remote.items()
        }
        owners: dict[int, PartitionOwner] = {}
        for i in local:
            try:
                owners[i] = await self.owner(parts[i][0], parts[i][1])
            except (MetadataStoreError, FencedError, OSError):
                results[i] = {"error": int(ErrorCode.not_leader_or_follower), "hwm": -1, "log_start": -1}
        deadline = asyncio.get_running_loop().time() + max_wait_ms / 1000
        event = asyncio.Event()
        for o in owners.values():
            o.add_data_waiter(event)
        try:
            while True:
                event.clear()
                budget = max_bytes
                total = 0
                for i, o in owners.items():
                    r = await self._read_one(o, parts[i][2], min(parts[i][3], max(budget, 1)))
                    results[i] = r
                    n = len(r.get("records") or b"")
                    total += n
                    budget -= n
                now = asyncio.get_running_loop().time()
                if total >= min_bytes or now >= deadline or not owners or any(
                        r is not None and r["error"] for r in (results[i] for i in owners)):
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), timeout=deadline - now)
        finally:
            for o in owners.values():
                o.remove_data_waiter(event)
        for shard, call in remote_calls.items():
            try:
                answers = await call
            except Exception as e:
                log.warning("forwarded fetch to shard %d failed: %s", shard, e)
                answers = [{"error": int(ErrorCode.not_leader_or_follower), "hwm": -1, "log_start": -1}] * len(
                    remote[shard])
            for i, answer in zip(remote[shard], answers, strict=True):
                results[i] = answer
        return [r if r is not None else {"error": int(ErrorCode.unknown_server_error), "hwm": -1,
                                         "log_start": -1} for r in results]

    async def _read_one(self, owner: PartitionOwner, offset: int, max_bytes: int) -> dict[str, Any]:
        base = {"hwm": owner.high_watermark, "log_start": owner.log_start_offset}
        if owner.fenced or owner.closed:
            return {"error": int(ErrorCode.not_leader_or_follower), **base}
        if offset < owner.log_start_offset or offset > owner.high_watermark:
            return {"error": int(ErrorCode.offset_out_of_range), **base}
        if offset == owner.high_watermark:
            return {"error": 0, "records": b"", **base}
        if owner.objects.state() != HealthState.HEALTHY and not owner.reader.cached(offset):
            # The seed's health gating: no new reads pile onto a sick object store; the consumer
            # retries. Committed data already in memory is still served: it needs no S3 call.
            return {"error": int(ErrorCode.kafka_storage_error), **base}
        try:
            records = await owner.reader.read(offset, max_bytes)
        except Exception as e:
            log.warning("read of %s-%d at %d failed: %s", owner.topic, owner.partition, offset, e)
            return {"error": int(ErrorCode.kafka_storage_error), **base}
        self.metrics.fetched(owner.topic, records)
        return {"error": 0, "records": records, **base}

    async def list_offset(self, topic: str, partition: int, timestamp: int) -> dict[str, Any]:
        info = await self.topics.get(topic)
        if info is None or not 0 <= partition < info.partitions:
            return {"error": int(ErrorCode.unknown_topic_or_partition), "offset": -1, "timestamp": -1}
        if not self.is_local(info, partition):
            return await self._forward(self.leader_of(info, partition), "list_offset", (topic, partition, timestamp))
        try:
            owner = await self.owner(topic, partition)
        except (MetadataStoreError, FencedError, OSError):
            return {"error": int(ErrorCode.not_leader_or_follower), "offset": -1, "timestamp": -1}
        if timestamp == -1:
            return {"error": 0, "offset": owner.high_watermark, "timestamp": -1}
        if timestamp == -2:
            return {"error": 0, "offset": owner.log_start_offset, "timestamp": -1}
        try:
            if timestamp == -3:
                found = await owner.reader.max_timestamp_offset()
            else:
                found = await owner.reader.offset_for_timestamp(timestamp)
        except Exception as e:
            log.warning("timestamp lookup on %s-%d failed: %s", topic, partition, e)
            return {"error": int(ErrorCode.kafka_storage_error), "offset": -1, "timestamp": -1}
        if found is None:
            return {"error": 0, "offset": -1 if timestamp >= 0 else owner.high_watermark, "timestamp": -1}
        return {"error": 0, "offset": found[0], "timestamp": found[1]}

    async def delete_records(self, topic: str, partition: int, offset: int) -> dict[str, Any]:
        return await retention.delete_records(self, topic, partition, offset)

    async def group_lag(self, group_id: str) -> list[dict[str, Any]]:
        """Per partition the group committed to: committed offset, high watermark, lag (for metrics and the CLI)."""
        if self.groups.check(group_id) == ErrorCode.not_coordinator and self.forward is not None:
            return await self._forward(group_registry.coordinator_of(self, group_id), "group_lag", (group_id,))
        return await group_registry.group_lag(self, group_id)

    async def _forward(self, shard: int, method: str, args: tuple[Any, ...]) -> Any:
        assert self.forward is not None
        return await self.forward(shard, method, args)


def _append_result(outcome: AppendOutcome) -> dict[str, Any]:
    return {"error": int(outcome.error), "base_offset": outcome.base_offset,
            "log_append_time": outcome.log_append_time, "log_start_offset": outcome.log_start_offset,
            "message": outcome.message}
