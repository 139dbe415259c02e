"""The shard actors the controller runs: one detached actor per wanted shard, pinned to its node.

This is their one owner: which actor runs each shard, which are starting, and which were retired for good (a
scaled-away shard, or one of a gone node: ids are never reused, and a retired shard is never started again).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from kafscale.acceptor.listener import PortInUse
from kafscale.actors.shard_actor import ShardActor, shard_actor_name
from kafscale.cluster import placement_store as store
from kafscale.config import BrokerConfig

log = logging.getLogger(__name__)
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0


class ShardActors:
    def __init__(self, config: BrokerConfig, ray_namespace: str, env: dict[str, str], metadata_actor: str | None,
                 num_cpus: float) -> None:
        self.config = config
        self.ray_namespace = ray_namespace
        self.env = env
        self.metadata_actor = metadata_actor  # the embedded store's actor, or None with etcd
        self.num_cpus = num_cpus  # what each shard asks Ray for (under --autoscale, so nodes fill up and scale)
        self.handles: dict[int, tuple[str, Any]] = {}  # shard id -> (node id, actor)
        self.starting: dict[int, asyncio.Future[Any]] = {}
        self.retired: set[int] = set()
        self.port_in_use: dict[int, str] = {}  # shards whose start found their port taken -> why (the controller's)

    def actor(self, shard: store.WantedShard) -> Any:
        """The shard's actor on its node: the running one (after a controller restart too), else a new one."""
        known = self.handles.get(shard.id)
        if known is not None and known[0] == shard.node_id:
            return known[1]
        if known is not None:  # adopted by another node: the old actor cannot run there
            self.end(shard.id)
        handle = ShardActor.options(  # type: ignore[attr-defined]
            name=shard_actor_name(shard.id), namespace=self.ray_namespace, get_if_exists=True,
            num_cpus=self.num_cpus, lifetime="detached", runtime_env={"env_vars": self.env},
            scheduling_strategy=NodeAffinitySchedulingStrategy(shard.node_id, soft=False),
        ).remote(shard.id, dataclasses.asdict(self.config), shard.port, shard.host, self.metadata_actor,
                 self.ray_namespace)
        self.handles[shard.id] = (shard.node_id, handle)
        return handle

    def start(self, shard: store.WantedShard) -> None:
        """A shard that is not live is (being) started: start() is idempotent, and Ray restarts a crashed one."""
        if shard.id in self.starting:
            return
        future = asyncio.ensure_future(asyncio.wait_for(self.actor(shard).start.remote(), START_TIMEOUT_S))
        self.starting[shard.id] = future

        def done(f: asyncio.Future[Any]) -> None:
            self.starting.pop(shard.id, None)
            error = None if f.cancelled() else f.exception()
            if error is None:
                return
            cause = getattr(error, "cause", error)  # Ray's RayTaskError carries the actor's exception
            if isinstance(cause, PortInUse):
                self.port_in_use[shard.id] = str(cause.strerror)
                return
            log.warning("controller: shard %d not started yet: %s", shard.id, error)

        future.add_done_callback(done)

    def by_shard(self, among: set[int] | None = None) -> dict[int, Any]:
        """The actors (of the shards `among`, default all)."""
        return {s: h for s, (_, h) in self.handles.items() if among is None or s in among}

    async def stop(self, shard_id: int, timeout_s: float) -> None:
        """Stopped cleanly (flushed, partitions let go, lease revoked), if it answers in time."""
        known = self.handles.get(shard_id)
        if known is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(known[1].stop.remote(), timeout_s)

    def retire(self, shard_id: int) -> None:
        """Ended for good: never started again."""
        self.retired.add(shard_id)
        self.end(shard_id)

    def end(self, shard_id: int) -> None:
        known = self.handles.pop(shard_id, None)
        handle = known[1] if known else None
        if handle is None:
            with contextlib.suppress(Exception):
                handle = ray.get_actor(shard_actor_name(shard_id), namespace=self.ray_namespace)
        if handle is not None:
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)

    async def stop_all(self) -> None:
        """Every shard stopped cleanly, then ended."""
        for f in self.starting.values():
            f.cancel()
        handles = dict(self.handles)
        results = await asyncio.gather(*(asyncio.wait_for(h.stop.remote(), STOP_TIMEOUT_S)
                                         for _, h in handles.values()), return_exceptions=True)
        for shard_id, r in zip(handles, results, strict=True):
            if isinstance(r, Exception):
                log.warning("shard %d did not stop cleanly: %s", shard_id, r)
        for shard_id in handles:
            self.end(shard_id)
