"""The controller actor: brings up the storage actor and the shards, and keeps them running.

It reconciles desired state (N shards on fixed ports) with what runs; the data path never waits
on it. Ray restarts a crashed shard process (max_restarts=-1); the controller's health loop then
calls start() on it again, which recovers its partitions from the stores.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import Any

import ray

from kafscale.config import BrokerConfig
from kafscale.logs import setup_logging
from kafscale.runtime.shard_actor import ShardActor, shard_actor_name

log = logging.getLogger(__name__)

CONTROLLER_NAME = "kafscale-controller"
METADATA_ACTOR_NAME = "kafscale-metadata"
HEALTH_INTERVAL_S = 1.0


@ray.remote(num_cpus=0, max_concurrency=1000)
class Controller:
    def __init__(self, config: dict[str, Any], ray_namespace: str) -> None:
        self.config = BrokerConfig(**config)
        setup_logging(self.config.log_level, self.config.log_json)
        self.ray_namespace = ray_namespace
        self.shards: list[Any] = []
        self.addresses: list[tuple[int, str, int]] = []
        self.metadata_actor: Any | None = None
        self._monitor: asyncio.Task[None] | None = None

    async def start(self) -> list[tuple[int, str, int]]:
        cfg = self.config
        if not cfg.etcd_endpoint_list():
            from kafscale.runtime.metadata_actor import MetadataStoreActor

            self.metadata_actor = MetadataStoreActor.options(
                name=METADATA_ACTOR_NAME, namespace=self.ray_namespace, num_cpus=0, max_concurrency=10_000,
            ).remote(data_dir=cfg.data_dir, etcd_endpoints=None, prefix=cfg.etcd_prefix)
            await self.metadata_actor.ready.remote()
        host, _ = cfg.listen_host_port()
        advertised = cfg.advertised_host or host
        ports = cfg.shard_port_list()
        if any(p == 0 for p in ports):
            from kafscale.net import free_port

            ports = [p or free_port() for p in ports]
        self.addresses = [(i, advertised, port) for i, port in enumerate(ports)]
        config = dataclasses.asdict(cfg)
        self.shards = [
            ShardActor.options(name=shard_actor_name(i), namespace=self.ray_namespace).remote(
                i, config, self.addresses, METADATA_ACTOR_NAME if self.metadata_actor else None,
                self.ray_namespace)
            for i in range(len(ports))
        ]
        started = await asyncio.gather(*(s.start.remote() for s in self.shards))
        self.addresses = [tuple(a) for a in started]  # type: ignore[misc]
        self._monitor = asyncio.get_running_loop().create_task(self._watch_shards())
        return self.addresses

    async def _watch_shards(self) -> None:
        """A shard whose process died is restarted by Ray; start it again so it serves."""
        while True:
            await asyncio.sleep(HEALTH_INTERVAL_S)
            for i, shard in enumerate(self.shards):
                try:
                    await asyncio.wait_for(shard.start.remote(), timeout=30)
                except Exception as e:
                    log.warning("shard %d not healthy yet: %s", i, e)

    async def status(self) -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(s.status.remote() for s in self.shards)))

    async def stop(self) -> None:
        """Flush and release every partition, then end the actors."""
        if self._monitor is not None:
            self._monitor.cancel()
        results = await asyncio.gather(*(s.stop.remote() for s in self.shards), return_exceptions=True)
        for i, r in enumerate(results):
            if isinstance(r, Exception):
                log.warning("shard %d did not stop cleanly: %s", i, r)
        for s in self.shards:
            with contextlib.suppress(Exception):
                ray.kill(s, no_restart=True)
        if self.metadata_actor is not None:
            with contextlib.suppress(Exception):
                await self.metadata_actor.close.remote()
            with contextlib.suppress(Exception):
                ray.kill(self.metadata_actor, no_restart=True)
