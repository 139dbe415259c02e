"""The controller: one loop that makes the cluster what it should be; the data path never waits on it.

Everything it decides is kept in the metadata store, so it can die and come back (it is a detached actor
that Ray restarts; its loop starts itself) without the shards noticing:
- `cluster/shards/{id}`: the shards wanted, `shards_per_node` on every alive Ray node (kafscale.cluster.assign
  .plan_shards) or, with --autoscale, as many as the load needs where they fit (kafscale.actors.scaler), each
  a detached actor pinned to its node;
- each topic's placement and `cluster/groups`: who leads each partition and coordinates each group slot.

Each round (every RECONCILE_S, and at once when a shard's lease lapses):
1. nodes: alive nodes get their shards, shards of dead nodes are forgotten (and their actors ended);
2. actors: every wanted shard has its actor, started (start() is idempotent; Ray restarts a crashed one);
3. healing: partitions and group slots whose shard is gone move to the live shards with the least work, at a
   new leader epoch. A shard is gone when it holds no lease and either its node is gone or its lease lapsed
   after it was seen live; one that never registered gets STARTUP_GRACE_S (RESTARTED_GRACE_S when this
   controller restarted into a running cluster);
4. with --autoscale, one scaling step (kafscale.actors.scaler): more shards, a shard drained and stopped, or
   partitions balanced by measured load.

Planned moves (move, rebalance, drain, autoscaling) hand off (kafscale.actors.planned_moves): the old shard
flushes, commits and lets go, then placement names the new one, which opens at a higher epoch with the producer
state its predecessor committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import ray

from kafscale.actors import planned_moves
from kafscale.actors.scaler import Scaler
from kafscale.actors.shard_actors import ShardActors
from kafscale.actors.stores import open_metadata_store
from kafscale.broker.log_dirs import LogDir
from kafscale.cluster import keys
from kafscale.cluster import placement_store as store
from kafscale.cluster.assign import Move, Node, free_slot, heal, plan_shards
from kafscale.cluster.layout import layout
from kafscale.cluster.topics import TopicInfo
from kafscale.config import BrokerConfig, ConfigError
from kafscale.console.server import ConsoleServer, start_console
from kafscale.console.view import TopicStorage
from kafscale.logs import setup_logging
from kafscale.ops.metadata_gauges import metadata_gauges
from kafscale.storage.compaction import Compactor
from kafscale.storage.metadata_store import MetadataStore

log = logging.getLogger(__name__)

CONTROLLER_NAME = "kafscale-controller"
METADATA_ACTOR_NAME = "kafscale-metadata"
RECONCILE_S = 1.0
STARTUP_GRACE_S = 30.0  # a wanted shard that never registered is given this long before its work moves
STATUS_TIMEOUT_S = 5.0  # a shard that does not answer the console's overview by then is shown without its report
RESTARTED_GRACE_S = 6.0  # after a controller restart, for shards not live at its first round
ADVERTISED_HOST_LABEL = "kafscale-advertised-host"
SHARDS_LABEL = "kafscale-shards"


@ray.remote(num_cpus=0, max_restarts=-1, max_concurrency=1000)
class Controller:
    def __init__(self, config: dict[str, Any], ray_namespace: str, env: dict[str, str] | None = None,
                 console_env: dict[str, str] | None = None) -> None:
        self.config = BrokerConfig(**config)
        # The console's login (KAFSCALE_UI_*): an argument, not the actor's environment, which the Ray dashboard
        # shows to whoever opens it.
        self.console_env = dict(console_env or {})
        self.console: ConsoleServer | None = None
        self.bootstrap = ""  # the live shards' addresses, for the console's Kafka clients
        setup_logging(self.config.log_level, self.config.log_json)
        self.ray_namespace = ray_namespace
        self.env = dict(env or {})  # travels to every actor: shards on other nodes do not see serve's environment
        self.node_id = ray.get_runtime_context().get_node_id()
        self.meta: MetadataStore | None = None
        self.actors = ShardActors(self.config, ray_namespace, self.env,
                                  None if self.config.etcd_endpoint_list() else METADATA_ACTOR_NAME,
                                  self.config.shard_cpus if self.config.autoscale else 0)
        self.seen_live: set[int] = set()
        self.missing_since: dict[int, float] = {}
        self.live: set[int] = set()
        self.known_nodes: set[str] = set()
        self.rounds = 0
        self._check_placement = True  # placement may name shards that are gone (at start, after a forget)
        self.stopping = False
        self.warned: set[str] = set()
        self.blocked_slots: dict[str, set[int]] = {}  # per address: port slots a shard found taken (never again)
        self._wake = asyncio.Event()
        self._moves = asyncio.Semaphore(self.config.moves_in_flight)
        self.scaler = Scaler(self.config, self.node_id) if self.config.autoscale else None
        self.capacity = 0  # shards the alive nodes fit, under --autoscale
        self.compactor: Compactor | None = None
        # Started here, not by a call: after Ray restarts this actor, nobody would call start() again.
        self._loop = asyncio.get_event_loop().create_task(self._run())

    # ---------------------------------------------------------------- the loop

    async def _run(self) -> None:
        while self.meta is None and not self.stopping:
            try:
                self.meta = await self._open_store()
            except Exception as e:
                log.warning("controller: metadata store not reachable yet: %s", e)
                await asyncio.sleep(RECONCILE_S)
        assert self.meta is not None
        watch = asyncio.get_running_loop().create_task(self._watch_leases(self.meta))
        compaction = self._start_compaction(self.meta)
        try:
            self.console = await start_console(self.config, self.console_env, lambda: self.bootstrap, self.overview,
                                               placement=self)
        except Exception:
            log.exception("controller: the console did not start (console_listen %s)", self.config.console_listen)
        try:
            while not self.stopping:
                try:
                    await self._reconcile(self.meta)
                    self.rounds += 1
                except Exception:
                    log.exception("controller round failed; retrying")
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), RECONCILE_S)
        finally:
            watch.cancel()
            if compaction is not None:
                compaction.cancel()
            if self.console is not None:
                await self.console.stop()

    def _start_compaction(self, meta: MetadataStore) -> asyncio.Task[None] | None:
        """One compactor per cluster, here: the controller is the one loop every deployment has."""
        if not self.config.metadata_compaction_interval_s:
            return None
        self.compactor = Compactor(meta, self.config.metadata_compaction_interval_s, self.config.metadata_history_s)
        self.compactor.on_round = metadata_gauges()
        return asyncio.get_running_loop().create_task(self.compactor.run())

    async def _open_store(self) -> MetadataStore:
        actor = None
        if not self.config.etcd_endpoint_list():
            from kafscale.actors.metadata_actor import start_metadata_actor

            actor = start_metadata_actor(METADATA_ACTOR_NAME, self.config, self.ray_namespace, self.env, self.node_id)
            await actor.ready.remote()
        return open_metadata_store(self.config, METADATA_ACTOR_NAME if actor else None, self.ray_namespace)

    async def _watch_leases(self, meta: MetadataStore) -> None:
        """A lapsed lease wakes the loop at once: healing must not wait for the next round."""
        while not self.stopping:
            try:
                async for event in meta.watch(keys.BROKERS):
                    if event.type == "delete":
                        self._wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("controller: lease watch interrupted: %s", e)
                await asyncio.sleep(RECONCILE_S)

    async def _reconcile(self, meta: MetadataStore) -> None:
        wanted = await self._place_shards(meta)
        live = await store.live_shards(meta)
        self.live = set(live)  # every lease holder: none of them may lose work to healing
        self.bootstrap = ",".join(f"{r.host}:{r.port}" for _, r in sorted(live.items()))
        # A registration from a node this Ray cluster never had is an earlier run's, whose lease the store
        # renewed when it restarted (as etcd does): it holds its lease out, but it is not this cluster running.
        current = {s for s, r in live.items() if not r.node_id or r.node_id in self.known_nodes}
        # A scale-down may have retired a shard while this round awaited the store: never start it again.
        wanted = {s: shard for s, shard in wanted.items() if s not in self.actors.retired}
        for stray in sorted(s for s in current - self.actors.retired if s not in wanted and live[s].node_id):
            # Registered in this cluster but not wanted (retired by a controller that died before ending
            # it): it would hold its lease, and show in Metadata, forever.
            log.warning("controller: shard %d runs but is not wanted; ending it", stray)
            self.actors.retire(stray)
        now = time.monotonic()
        # This controller has just (re)started while the cluster runs: a shard missing now died meanwhile,
        # and gets only the time a restarting process needs, not the grace of a cluster starting up.
        restarted = self.rounds == 0 and bool(current)
        for shard in wanted.values():
            self.actors.actor(shard)
            if restarted and shard.id not in current:
                self.missing_since.setdefault(shard.id, now - STARTUP_GRACE_S + RESTARTED_GRACE_S)
            if shard.id in current:
                self.seen_live.add(shard.id)
                self.missing_since.pop(shard.id, None)
            else:
                self.missing_since.setdefault(shard.id, now)
                self.actors.start(shard)  # step 2
        await store.ensure_group_slots(meta, list(wanted))
        await self._heal(meta, wanted)
        if self.scaler is not None:
            handles = self.actors.by_shard()
            placed = {s: shard.node_id for s, shard in wanted.items()}
            await self.scaler.step(meta, handles, self.live, placed, self.capacity, self._hand_off, self._forget)

    def _nodes(self, wanted: dict[int, store.WantedShard]) -> tuple[list[Node], dict[str, dict[str, str]]]:
        """The alive nodes that should run shards, and every alive node's labels."""
        nodes = []
        local_objects = not self.config.s3_bucket and not self.config.shared_data_dir
        every = ray.nodes()
        self.known_nodes = {n["NodeID"] for n in every}  # alive or dead: the nodes this Ray cluster has had
        alive = [n for n in every if n.get("Alive")]
        labels = {n["NodeID"]: dict(n.get("Labels") or {}) for n in alive}
        fit = None
        if self.scaler is not None:
            running = Counter(shard.node_id for shard in wanted.values())
            usable = [n for n in alive if not local_objects or n["NodeID"] == self.node_id]
            fit = self.scaler.fit(usable, running, set(wanted))
            self.capacity = fit.capacity
            self.scaler.request_nodes(fit)
        for n in alive:
            node_id = n["NodeID"]
            if local_objects and node_id != self.node_id:
                if node_id not in self.warned:
                    self.warned.add(node_id)
                    log.error("node %s gets no shards: the object store is the local directory %s, which other"
                              " nodes cannot read (use S3, or --shared-data-dir if it is shared)",
                              n["NodeManagerAddress"], self.config.data_dir)
                continue
            count = self.config.shards_on(n.get("Resources", {}).get("CPU"))
            if fit is not None:
                count = fit.per_node.get(node_id, 0)
            elif SHARDS_LABEL in labels[node_id]:
                count = int(labels[node_id][SHARDS_LABEL])
            nodes.append(Node(node_id, n["NodeManagerAddress"], count))
        return nodes, labels

    async def _place_shards(self, meta: MetadataStore) -> dict[int, store.WantedShard]:
        """Step 1: the shards every alive node should run, kept in the store."""
        wanted = await store.wanted_shards(meta)
        nodes, labels = self._nodes(wanted)
        plan = plan_shards(nodes, {s.id: (s.node_id, s.node_ip, s.slot) for s in wanted.values()}, self.blocked_slots)
        ips = {n.id: n.ip for n in nodes}

        def where(node_id: str, slot: int) -> tuple[str, int]:
            """Advertised host and port, from the settings this controller runs with."""
            label = labels.get(node_id, {}).get(ADVERTISED_HOST_LABEL, "")
            return self.config.advertised_for(ips[node_id], label), self.config.shard_port(slot)

        for shard_id, node_id in plan.keep.items():
            shard = wanted[shard_id]
            host, port = where(node_id, shard.slot)
            # Adopted by the node now at its address, or served with other settings than before.
            if (shard.node_id, shard.node_ip, shard.host, shard.port) != (node_id, ips[node_id], host, port):
                wanted[shard_id] = dataclasses.replace(shard, node_id=node_id, node_ip=ips[node_id], host=host,
                                                       port=port)
                await store.want(meta, wanted[shard_id])
        for node_id, ip, slot in plan.new:
            shard = store.WantedShard(await store.allocate_shard_id(meta), node_id, ip, slot, *where(node_id, slot))
            await store.want(meta, shard)
            wanted[shard.id] = shard
            log.info("controller: shard %d on node %s (%s), port slot %d", shard.id, ip, node_id[:8], slot)
        for shard_id, why in list(self.actors.port_in_use.items()):
            del self.actors.port_in_use[shard_id]
            if shard_id in wanted and wanted[shard_id].node_id in ips:
                await self._move_port(meta, wanted, wanted[shard_id], why, where)
        if plan.forget and (drained := await store.draining(meta)) & set(plan.forget):
            await store.set_draining(meta, drained - set(plan.forget))  # gone: drained for good
        if plan.forget:
            self._check_placement = True
        for shard_id in plan.forget:
            log.warning("controller: shard %d's node is gone; its work moves to live shards", shard_id)
            await store.forget(meta, shard_id)
            wanted.pop(shard_id, None)
            self.seen_live.discard(shard_id)
            self.actors.retire(shard_id)
        return wanted

    async def _move_port(self, meta: MetadataStore, wanted: dict[int, store.WantedShard], shard: store.WantedShard,
                         why: str, where: Callable[[str, int], tuple[str, int]]) -> None:
        """A shard whose port is taken goes to the next free port slot of its address, with a new actor (the old
        one was made for the old port). The taken slot is not used again."""
        blocked = self.blocked_slots.setdefault(shard.node_ip, set())
        blocked.add(shard.slot)
        slot = free_slot({s.slot for s in wanted.values() if s.node_ip == shard.node_ip} | blocked)
        try:
            host, port = where(shard.node_id, slot)
        except ConfigError as e:
            log.error("controller: shard %d cannot start: %s, and no other port is left to it (%s)", shard.id, why, e)
            return
        log.warning("controller: shard %d cannot start: %s; it moves to port slot %d (port %d)", shard.id, why,
                    slot, port)
        wanted[shard.id] = dataclasses.replace(shard, slot=slot, host=host, port=port)
        await store.want(meta, wanted[shard.id])
        self.actors.end(shard.id)

    async def _forget(self, shard_id: int) -> None:
        """A shard scaled away, its work already moved: stopped cleanly (its lease goes with it), then ended."""
        await self.actors.stop(shard_id, 30)
        await store.forget(await self._store(), shard_id)
        self.seen_live.discard(shard_id)
        self.missing_since.pop(shard_id, None)
        self.actors.retire(shard_id)

    def _dead(self, wanted: dict[int, store.WantedShard]) -> set[int]:
        now = time.monotonic()
        return {s for s, since in self.missing_since.items()
                if s in self.seen_live or now - since > STARTUP_GRACE_S} | {-1}

    async def _heal(self, meta: MetadataStore, wanted: dict[int, store.WantedShard]) -> None:
        """Step 3: work on gone shards goes to live ones. Placement is read only when a shard is dead or was
        forgotten (or at the first round, and until a round finds nothing to move): at 100,000 partitions a
        read of every topic each second would be the controller's main load on the store."""
        if not self.live or (not self._check_placement and not (self._dead(wanted) - {-1}) - self.live):
            return
        infos = await store.topics(meta)
        parts = store.partition_assignment(infos)
        slots = store.slot_assignment(await store.group_slots(meta))
        # Never a shard that holds a lease, even if Ray has declared its node dead: until the lease lapses it
        # may still serve, and two shards must never both lead a partition.
        gone = (self._dead(wanted) | ({s for s in set(parts.values()) | set(slots.values())} - set(wanted))) - self.live
        targets = (self.live - await store.draining(meta)) or self.live
        moves = heal(parts, targets, gone) + heal(slots, targets, gone)
        self._check_placement = bool(moves)  # look again next round: a move found stale is decided anew
        if moves:
            done = await store.write_moves(meta, moves)
            log.warning("controller: healed %d partitions and group slots of shards %s", len(done),
                        sorted({m.source for m in done}))

    # ---------------------------------------------------------------- planned moves

    async def _hand_off(self, moves: list[Move]) -> list[dict[str, Any]]:
        assert self.meta is not None
        release = {s: h.release for s, h in self.actors.by_shard(self.live).items()}
        return await planned_moves.hand_off(self.meta, moves, release, self._moves)

    async def move(self, topic: str, partition: int, target: int) -> dict[str, Any]:
        """`kafscale partition move`: one partition to a live shard."""
        return await planned_moves.move_partition(await self._store(), topic, partition, target, self._hand_off)

    async def rebalance(self) -> list[dict[str, Any]]:
        """`kafscale cluster rebalance`: partitions and group slots even over the live shards."""
        return await planned_moves.rebalance(await self._store(), self._hand_off)

    async def drain(self, node: str) -> list[dict[str, Any]]:
        """`kafscale cluster drain`: everything off the shards of a node (by IP or node id prefix)."""
        return await planned_moves.drain_node(await self._store(), node, self._hand_off)

    # ---------------------------------------------------------------- inspection and lifecycle

    async def _store(self) -> MetadataStore:
        while self.meta is None:
            await asyncio.sleep(0.1)
        return self.meta

    async def wait_ready(self, timeout: float = 120) -> list[tuple[int, str, int]]:
        """Once every wanted shard is live and nothing is placed on a gone one: the shards' addresses."""
        deadline = time.monotonic() + timeout
        while True:
            meta = await self._store()
            rounds = self.rounds
            wanted = await store.wanted_shards(meta)
            live = await store.live_shards(meta)
            placed = set(store.partition_assignment(await store.topics(meta)).values())
            if wanted and set(wanted) <= set(live) and placed <= set(live) and rounds > 0:
                return [(b.id, b.host, b.port) for b in sorted(live.values(), key=lambda b: b.id)]
            if time.monotonic() > deadline:
                missing = sorted(set(wanted) - set(live))
                raise TimeoutError(f"shards {missing} did not register within {timeout:.0f}s")
            self._wake.set()
            await asyncio.sleep(0.2)

    async def info(self) -> dict[str, Any]:
        """`kafscale cluster info`: the layout (kafscale.cluster.layout), and this controller."""
        state = self.compactor.state if self.compactor is not None else None
        return {**await layout(await self._store()), "rounds": self.rounds,
                "controller": {"node_id": self.node_id, "pid": os.getpid()},
                "metadata": {"revision": state.status.revision, "db_bytes": state.status.db_bytes,
                             "compacted_revision": state.compacted_revision} if state is not None else None}

    async def overview(self) -> dict[str, Any]:
        """The console's overview: the layout, this controller, and each live shard's own report."""
        handles = [h for s, h in self.actors.by_shard().items() if s in self.live]

        async def report(h: Any) -> dict[str, Any]:
            status, load = await asyncio.gather(h.status.remote(), h.load.remote())
            return {**status, "busy": round(load.busy, 3), "bytes_in_per_s": round(load.bytes_in),
                    "bytes_out_per_s": round(load.bytes_out), "requests_per_s": round(load.requests, 1)}

        answers = await asyncio.gather(*(asyncio.wait_for(report(h), STATUS_TIMEOUT_S) for h in handles),
                                       return_exceptions=True)  # a shard that does not answer is left out
        shards = {a["shard"]: a for a in answers if isinstance(a, dict)}
        return {**await self.info(), "shards": shards, "metadata_store": await self._store_health(),
                "autoscaler": self.scaler.report() if self.scaler is not None else None}

    async def topic_storage(self, topic: str) -> TopicStorage:
        """The console's topic page: its physical partitions, and each partition's size from the log directory
        of the live shard that leads it."""
        found = await (await self._store()).get(keys.topic(topic))
        physical = TopicInfo.from_value(topic, found.value).physical if found is not None else 0
        handles = [h for s, h in self.actors.by_shard().items() if s in self.live]
        answers = await asyncio.gather(*(asyncio.wait_for(h.log_dir.remote({topic: None}), STATUS_TIMEOUT_S)
                                         for h in handles), return_exceptions=True)
        return TopicStorage(physical, {p.partition: p.size for a in answers if isinstance(a, LogDir)
                                       for p in a.partitions})

    async def _store_health(self) -> str:
        try:
            await asyncio.wait_for((await self._store()).get(keys.CLUSTER), STATUS_TIMEOUT_S)
            return "ok"
        except TimeoutError:
            return f"no answer within {STATUS_TIMEOUT_S}s"
        except Exception as e:
            return f"failed: {e}"

    def console_url(self) -> str:
        return self.console.url if self.console is not None else ""

    async def status(self) -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(h.status.remote() for h in self.actors.by_shard().values())))

    async def stop(self) -> None:
        """Flush and release every partition, then end the shards and the metadata actor (the wanted shards
        stay in the store, so the next `kafscale serve` on these hosts brings back the same broker ids)."""
        self.stopping = True
        if self.scaler is not None:
            await self.scaler.stop()
        self._loop.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._loop
        await self.actors.stop_all()
        if self.meta is not None:
            with contextlib.suppress(Exception):
                await self.meta.close()
        with contextlib.suppress(Exception):
            metadata_actor = ray.get_actor(METADATA_ACTOR_NAME, namespace=self.ray_namespace)
            with contextlib.suppress(Exception):
                await metadata_actor.close.remote()
            ray.kill(metadata_actor, no_restart=True)
