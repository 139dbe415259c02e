"""The Ray actor hosting one ShardCore; a named actor ("kafscale-shard-N") in the Ray dashboard."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from typing import Any

import ray

from kafscale.broker.shard import ShardAddress, ShardCore
from kafscale.config import BrokerConfig
from kafscale.logs import setup_logging
from kafscale.runtime.heap import tune_gc_for_serving

log = logging.getLogger(__name__)


def shard_actor_name(shard_id: int) -> str:
    return f"kafscale-shard-{shard_id}"


def open_metadata_store(config: BrokerConfig, metadata_actor: str | None, ray_namespace: str) -> Any:
    """etcd is shared by nature: every shard connects itself. The embedded store lives in one actor."""
    if config.etcd_endpoint_list():
        from kafscale.storage.etcd_store import EtcdStore

        return EtcdStore(config.etcd_endpoint_list(), prefix=config.etcd_prefix)
    from kafscale.runtime.metadata_actor import RemoteMetadataStore

    assert metadata_actor is not None, "embedded metadata needs the metadata actor"
    return RemoteMetadataStore(ray.get_actor(metadata_actor, namespace=ray_namespace))


def open_object_store(config: BrokerConfig) -> Any:
    from kafscale.storage.object_stores import object_store_from_settings

    return object_store_from_settings(
        data_dir=config.data_dir, s3_endpoint=config.s3_endpoint or None, s3_bucket=config.s3_bucket or None,
        s3_region=config.s3_region or None, s3_access_key=config.s3_access_key or None,
        s3_secret_key=config.s3_secret_key or None, s3_create_bucket=config.s3_create_bucket,
    )


@ray.remote(num_cpus=0, max_restarts=-1, max_concurrency=10_000)
class ShardActor:
    def __init__(self, shard_id: int, config: dict[str, Any], shards: list[tuple[int, str, int]],
                 metadata_actor: str | None, ray_namespace: str) -> None:
        self.shard_id = shard_id
        self.config = BrokerConfig(**config)
        setup_logging(self.config.log_level, self.config.log_json)
        self.shards = [ShardAddress(*s) for s in shards]
        self.metadata_actor = metadata_actor
        self.ray_namespace = ray_namespace
        self.core: ShardCore | None = None
        self._starting: asyncio.Task[ShardAddress] | None = None
        self._handles: dict[int, Any] = {}

    async def _forward(self, shard_id: int, method: str, args: tuple[Any, ...]) -> Any:
        handle = self._handles.get(shard_id)
        if handle is None:
            handle = ray.get_actor(shard_actor_name(shard_id), namespace=self.ray_namespace)
            self._handles[shard_id] = handle
        return await getattr(handle, method).remote(*args)

    async def _start(self) -> ShardAddress:
        meta = open_metadata_store(self.config, self.metadata_actor, self.ray_namespace)
        core = ShardCore(self.shard_id, self.config, meta=meta, objects=open_object_store(self.config),
                         shards=self.shards, forward=self._forward)
        address = await core.start()
        self.core = core
        from kafscale.ops.ray_mirror import RayMirror  # the Ray dashboard's copy of the shard's metrics

        mirror = RayMirror(core.metrics.registry, self.shard_id)
        self._ray_metrics = asyncio.get_running_loop().create_task(mirror.run())
        tune_gc_for_serving()
        return address

    async def start(self) -> tuple[int, str, int]:
        """Idempotent: after Ray restarts this actor, the controller's next call starts it again."""
        if self._starting is None:
            self._starting = asyncio.get_running_loop().create_task(self._start())
        a = await asyncio.shield(self._starting)
        return a.id, a.host, a.port

    async def _core(self) -> ShardCore:
        await self.start()
        assert self.core is not None
        return self.core

    async def produce(self, *args: Any) -> dict[str, Any]:
        return await (await self._core()).produce(*args)

    async def fetch(self, *args: Any) -> list[dict[str, Any]]:
        return await (await self._core()).fetch(*args)

    async def list_offset(self, *args: Any) -> dict[str, Any]:
        return await (await self._core()).list_offset(*args)

    async def delete_records(self, *args: Any) -> dict[str, Any]:
        return await (await self._core()).delete_records(*args)

    async def group_lag(self, group_id: str) -> list[dict[str, Any]]:
        return await (await self._core()).group_lag(group_id)

    async def status(self) -> dict[str, Any]:
        core = await self._core()
        # Ray runs actor loops on uvloop when it is installed; "asyncio" here means a slower broker.
        event_loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
        return {"shard": self.shard_id, "pid": os.getpid(), "port": core.listener.port, "owners": len(core.owners),
                "connections": core.listener.connections, "s3": core.objects.state().name.lower(),
                "event_loop": event_loop, "frozen_objects": gc.get_freeze_count(),
                "gc_thresholds": list(gc.get_threshold())}

    async def stop(self) -> None:
        if self.core is not None:
            await self.core.stop()
            self.core = None
