"""The Ray actor hosting one shard (a ShardHost); a named actor ("kafscale-shard-N") in the Ray dashboard."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from typing import Any

import ray

from kafscale.actors.cleaning_task import ray_offload
from kafscale.actors.heap import tune_gc_for_serving
from kafscale.actors.shard_host import ShardHost
from kafscale.actors.stores import open_metadata_store, open_object_store
from kafscale.broker.interface import FetchItem, Peer
from kafscale.broker.log_dirs import LogDir, Wanted
from kafscale.broker.results import (
    DeleteRecordsResult,
    FetchResult,
    GroupOffsets,
    OffsetResult,
    PartitionLag,
    ProduceResult,
)
from kafscale.broker.txn_admin import PartitionProducers
from kafscale.cluster.load import ShardLoad
from kafscale.cluster.placement import ShardAddress
from kafscale.config import BrokerConfig
from kafscale.logs import setup_logging
from kafscale.ops.ray_mirror import RayMirror
from kafscale.storage.control import TxnMarker

log = logging.getLogger(__name__)


def shard_actor_name(shard_id: int) -> str:
    return f"kafscale-shard-{shard_id}"


class RayPeer:
    """Another shard, called through its Ray actor: the broker's Peer calls, typed results back."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def produce(self, topic: str, partition: int, records: bytes | bytearray, acks: int,
                      timeout_ms: int) -> ProduceResult:
        return await self.handle.produce.remote(topic, partition, records, acks, timeout_ms)

    async def fetch(self, parts: list[FetchItem], max_wait_ms: int, min_bytes: int, max_bytes: int,
                    isolation_level: int = 0) -> list[FetchResult]:
        return await self.handle.fetch.remote(parts, max_wait_ms, min_bytes, max_bytes, isolation_level)

    async def list_offset(self, topic: str, partition: int, timestamp: int,
                          isolation_level: int = 0) -> OffsetResult:
        return await self.handle.list_offset.remote(topic, partition, timestamp, isolation_level)

    async def write_txn_marker(self, topic: str, partition: int, marker: TxnMarker, timeout_ms: int) -> int:
        return await self.handle.write_txn_marker.remote(topic, partition, marker, timeout_ms)

    async def complete_txn_offsets(self, group_id: str, producer_id: int, producer_epoch: int, commit: bool) -> int:
        return await self.handle.complete_txn_offsets.remote(group_id, producer_id, producer_epoch, commit)

    async def verify_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                         partitions: list[tuple[str, int]], group_id: str | None = None,
                         add: bool = False) -> list[int]:
        return await self.handle.verify_txn.remote(transactional_id, producer_id, producer_epoch, partitions,
                                                   group_id, add)

    async def describe_producers(self, topic: str, partition: int) -> PartitionProducers:
        return await self.handle.describe_producers.remote(topic, partition)

    async def delete_records(self, topic: str, partition: int, offset: int) -> DeleteRecordsResult:
        return await self.handle.delete_records.remote(topic, partition, offset)

    async def group_lag(self, group_id: str) -> list[PartitionLag]:
        return await self.handle.group_lag.remote(group_id)

    async def group_offsets(self, group_id: str, forwarded: bool = False) -> GroupOffsets:
        return await self.handle.group_offsets.remote(group_id, forwarded)


@ray.remote(num_cpus=0, max_restarts=-1, max_concurrency=10_000)
class ShardActor:
    """Created detached by the controller, pinned to its node; Ray restarts its process in place, and the
    controller's next start() call brings the shard back (it recovers its partitions from the stores)."""

    def __init__(self, shard_id: int, config: dict[str, Any], port: int, advertised_host: str,
                 metadata_actor: str | None, ray_namespace: str) -> None:
        self.shard_id = shard_id
        self.config = BrokerConfig(**config)
        setup_logging(self.config.log_level, self.config.log_json)
        self.port = port
        self.advertised_host = advertised_host
        self.metadata_actor = metadata_actor
        self.ray_namespace = ray_namespace
        self.node_ip = ray.util.get_node_ip_address()
        self.host: ShardHost | None = None
        self._starting: asyncio.Task[ShardAddress] | None = None
        self._peers: dict[int, Peer] = {}

    def __repr__(self) -> str:
        """The actor's name in the Ray dashboard and in log prefixes. Ray takes it once, after __init__, so it
        says what does not change; what the shard serves is in its metrics and `kafscale cluster info`."""
        port = self.port or "any"
        return f"Shard(id={self.shard_id}, node={self.node_ip}, listener={self.advertised_host}:{port})"

    def _peer(self, shard_id: int) -> Peer:
        peer = self._peers.get(shard_id)
        if peer is None:
            handle = ray.get_actor(shard_actor_name(shard_id), namespace=self.ray_namespace)
            peer = self._peers[shard_id] = RayPeer(handle)
        return peer

    async def _start(self) -> ShardAddress:
        meta = open_metadata_store(self.config, self.metadata_actor, self.ray_namespace)
        host = ShardHost(self.shard_id, self.config, meta=meta, objects=open_object_store(self.config),
                         peers=self._peer, port=self.port, advertised_host=self.advertised_host,
                         bind_host=self.config.bind_host(self.node_ip), node_ip=self.node_ip,
                         open_renewal_store=lambda: open_metadata_store(self.config, self.metadata_actor,
                                                                        self.ray_namespace),
                         offload=ray_offload(self.config))
        address = await host.start(node_id=ray.get_runtime_context().get_node_id(), node_ip=self.node_ip)
        self.host = host
        # The Ray dashboard's copy of the shard's metrics, tagged with the shard and its node.
        mirror = RayMirror(host.metrics.registry, self.shard_id, node=self.node_ip)
        self._ray_metrics = asyncio.get_running_loop().create_task(mirror.run())
        tune_gc_for_serving()
        return address

    async def start(self) -> tuple[int, str, int]:
        """Idempotent: after Ray restarts this actor, the controller's next call starts it again."""
        if self._starting is None:
            self._starting = asyncio.get_running_loop().create_task(self._start())
        a = await asyncio.shield(self._starting)
        return a.id, a.host, a.port

    async def _host(self) -> ShardHost:
        await self.start()
        assert self.host is not None
        return self.host

    async def produce(self, topic: str, partition: int, records: bytes | bytearray, acks: int,
                      timeout_ms: int) -> ProduceResult:
        return await (await self._host()).core.produce(topic, partition, records, acks, timeout_ms)

    async def fetch(self, parts: list[FetchItem], max_wait_ms: int, min_bytes: int, max_bytes: int,
                    isolation_level: int = 0) -> list[FetchResult]:
        return await (await self._host()).core.fetch(parts, max_wait_ms, min_bytes, max_bytes, isolation_level)

    async def list_offset(self, topic: str, partition: int, timestamp: int,
                          isolation_level: int = 0) -> OffsetResult:
        return await (await self._host()).core.list_offset(topic, partition, timestamp, isolation_level)

    async def write_txn_marker(self, topic: str, partition: int, marker: TxnMarker, timeout_ms: int) -> int:
        return await (await self._host()).core.write_txn_marker(topic, partition, marker, timeout_ms)

    async def complete_txn_offsets(self, group_id: str, producer_id: int, producer_epoch: int, commit: bool) -> int:
        return await (await self._host()).core.complete_txn_offsets(group_id, producer_id, producer_epoch, commit)

    async def verify_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                         partitions: list[tuple[str, int]], group_id: str | None = None,
                         add: bool = False) -> list[int]:
        return await (await self._host()).core.verify_txn(transactional_id, producer_id, producer_epoch, partitions,
                                                          group_id, add)

    async def describe_producers(self, topic: str, partition: int) -> PartitionProducers:
        return await (await self._host()).core.describe_producers(topic, partition)

    async def delete_records(self, topic: str, partition: int, offset: int) -> DeleteRecordsResult:
        return await (await self._host()).core.delete_records(topic, partition, offset)

    async def group_lag(self, group_id: str) -> list[PartitionLag]:
        return await (await self._host()).core.group_lag(group_id)

    async def group_offsets(self, group_id: str, forwarded: bool = False) -> GroupOffsets:
        return await (await self._host()).core.group_offsets(group_id, forwarded)

    async def release(self, topic: str, partition: int) -> int:
        """A planned move's first half (kafscale.broker.shard.ShardCore.release)."""
        return await (await self._host()).core.release(topic, partition)

    async def hosted(self) -> dict[str, Any]:
        """What this shard serves now, for `kafscale cluster info`."""
        host = await self._host()
        return {"shard": self.shard_id, "node_ip": self.node_ip, "host": host.advertised_host(),
                "port": host.listener.port, "serving": host.core.membership is None or host.core.membership.serving,
                "partitions": sorted(f"{t}-{p}" for t, p in host.core.owners),
                "groups": sorted(host.core.groups.groups)}

    async def log_dir(self, wanted: Wanted | None) -> LogDir:
        """DescribeLogDirs' answer, for the console's topic sizes (asked through the controller)."""
        return await (await self._host()).core.log_dir(wanted)

    async def load(self) -> ShardLoad:
        """The latest load sample (kafscale.ops.load_meter), for the controller: read, never computed here."""
        return (await self._host()).load_meter.latest

    async def status(self) -> dict[str, Any]:
        host = await self._host()
        # Ray runs actor loops on uvloop when it is installed; "asyncio" here means a slower broker.
        event_loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
        return {"shard": self.shard_id, "pid": os.getpid(), "port": host.listener.port,
                "owners": len(host.core.owners), "connections": host.listener.connections,
                "s3": host.core.objects.state().name.lower(), "event_loop": event_loop,
                "frozen_objects": gc.get_freeze_count(), "gc_thresholds": list(gc.get_threshold()),
                "actor_id": ray.get_runtime_context().get_actor_id()}  # the console links its Ray dashboard page

    async def stop(self) -> None:
        if self.host is not None:
            await self.host.stop()
            self.host = None
