"""`--autoscale`: the controller's loop runs one scaling step per round; the data path never waits on it.

Each step reads the shards' load (one Ray call per live shard: kafscale.ops.load_meter samples it), asks the
policy (kafscale.cluster.autoscale) for the shard count, and acts:
- more shards: the count is raised; the controller's placement step starts them on the nodes with room
  (kafscale.cluster.fit), and Ray's autoscaler is asked for nodes for those that fit nowhere;
- fewer: the least loaded shard is drained with planned moves (hand-off), then stopped and forgotten;
- balance: once every shard reports, and a shard runs above the target or holds nothing, partitions move by
  measured load (kafscale.cluster.assign.balance_by_load), a few at a time, only after the previous moves'
  effect has been measured.
The count and the shards being removed are kept in the metadata store (`cluster/autoscale`), so a controller
restarted in the middle of a scale-up or a drain finishes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

from kafscale.actors.planned_moves import HandOff, drain_shards
from kafscale.cluster import placement_store as store
from kafscale.cluster.assign import balance, balance_by_load, pick_to_drain
from kafscale.cluster.autoscale import Autoscaler, AutoscaleSettings, Decision
from kafscale.cluster.fit import Fit, fit_shards, node_capacity
from kafscale.cluster.load import ShardLoad
from kafscale.config import BrokerConfig
from kafscale.ops.load_meter import LOAD_INTERVAL_S
from kafscale.storage.metadata_store import MetadataStore

log = logging.getLogger(__name__)
LOAD_CALL_TIMEOUT_S = 2.0
SETTLE_S = 2 * LOAD_INTERVAL_S  # after moves, the load is measured afresh before anything else moves
SAY_EVERY_S = 30.0
DECISIONS_KEPT = 20


class Scaler:
    def __init__(self, config: BrokerConfig, home_node: str = "") -> None:
        self.config = config
        self.home_node = home_node  # the controller's node: its shards are drained last (it is never released)
        self.policy: Autoscaler | None = None  # made at the first step: max_shards may depend on the nodes
        self.state = store.ScaleState(config.min_shards)
        self.loaded = False
        self.loads: dict[int, ShardLoad] = {}
        self.requested = -1
        self.settled_at = 0.0
        self.said_at = 0.0
        self._task: asyncio.Task[None] | None = None
        self.metrics = _ScaleMetrics()
        self.last: dict[str, Any] | None = None  # the latest decision, for the console's overview
        self.changes: deque[dict[str, Any]] = deque(maxlen=DECISIONS_KEPT)

    # ---------------------------------------------------------------- where shards go

    def fit(self, nodes: list[dict[str, Any]], running: Mapping[str, int], present: Collection[int] = ()) -> Fit:
        """Shards per alive node for the wanted count (the controller's placement step asks). present: the
        shards wanted now; a shard being drained counts while it is among them (it still runs) and not once the
        drain has forgotten it, though the scale state still lists it until the drain ends: counted then, its
        node would get a new shard in its place."""
        capacity = {n["NodeID"]: node_capacity(n.get("Resources", {}).get("CPU"), self.config.shard_cpus)
                    for n in nodes}
        wanted = self.state.desired + len([s for s in self.state.removing if s in present])
        return fit_shards(max(wanted, sum(running.values())), capacity, running)

    def request_nodes(self, fit: Fit) -> None:
        """Ask Ray's autoscaler for room for every wanted shard (a floor it keeps nodes for: when the count
        shrinks, so does the request, and idle nodes go)."""
        bundles = self.state.desired + len(self.state.removing)
        if bundles == self.requested:
            return
        try:
            from ray.autoscaler.sdk import request_resources

            request_resources(bundles=[{"CPU": self.config.shard_cpus}] * bundles)
            self.requested = bundles
            if fit.unplaced:
                log.warning("autoscale: %d shard(s) fit on no alive node; asked Ray's autoscaler for nodes",
                            fit.unplaced)
        except Exception as e:  # no autoscaler (a local head): the shards that fit run, the rest wait
            log.warning("autoscale: could not ask Ray for resources: %s", e)

    # ---------------------------------------------------------------- one step per round

    async def step(self, meta: MetadataStore, handles: Mapping[int, Any], live: set[int], wanted: Mapping[int, str],
                   capacity: int, hand_off: HandOff, forget: Callable[[int], Awaitable[None]]) -> None:
        """wanted: the shards placed on nodes (shard id -> node id)."""
        if not self.loaded:
            self.state = await store.scale_state(meta) or self.state
            self.loaded = True
        if self.policy is None or self.policy.settings.max_shards != self._max(capacity):
            self.policy = Autoscaler(AutoscaleSettings(
                min_shards=self.config.min_shards, max_shards=self._max(capacity),
                target_utilization=self.config.target_utilization, scale_up_delay_s=self.config.scale_up_delay_s,
                scale_down_delay_s=self.config.scale_down_delay_s))
        if self._task is not None and not self._task.done():
            return  # moves in progress: their effect is measured before anything else is decided
        await self._poll(handles, live)
        active = sorted(s for s in wanted if s not in self.state.removing)
        if self.state.removing:
            self._run(self._remove(meta, list(self.state.removing), active, hand_off, forget))
            return
        now = time.monotonic()
        reporting = [self.loads[s] for s in active if s in self.loads]
        # Shards placed on a node report once started (a starting one may soon carry load: it holds a
        # scale-down back); those wanted beyond them wait for a node and carry nothing.
        decision = self.policy.decide(now, max(self.state.desired, len(active)), reporting, running=len(active))
        self.metrics.set(decision, len(active))
        self._note(decision, len(active), reporting)
        if not decision.change and now - self.said_at >= SAY_EVERY_S:  # why nothing changes, now and then
            log.info("autoscale: %d shards: %s", len(active), decision.reason)
            self.said_at = now
        if decision.change:
            log.warning("autoscale: %d -> %d shards: %s", decision.current, decision.desired, decision.reason)
            if decision.desired >= len(active):  # more, or fewer of those not started yet: nothing to drain
                await self._save(meta, store.ScaleState(decision.desired, (), decision.reason))
                return
            loads = {s: self.loads[s].busy for s in active if s in self.loads}
            items = _items_by_shard(store.partition_assignment(await store.topics(meta)), active)
            leaving: list[int] = []
            while len(active) - len(leaving) > decision.desired:
                victim = pick_to_drain({s: b for s, b in loads.items() if s not in leaving},
                                       {s: n for s, n in items.items() if s not in leaving}, wanted, self.home_node)
                leaving.append(victim)
            await self._save(meta, store.ScaleState(decision.desired, tuple(leaving), decision.reason))
            self._run(self._remove(meta, leaving, [s for s in active if s not in leaving], hand_off, forget))
            return
        if now - self.settled_at >= SETTLE_S and set(active) <= set(self.loads) and set(active) <= live:
            self._run(self._balance(meta, active, hand_off, by_load=decision.rebalance))

    def _note(self, decision: Decision, running: int, reporting: list[ShardLoad]) -> None:
        self.last = {"at": time.time(), "shards": running, "desired": decision.desired, "change": decision.change,
                     "reason": decision.reason, "busy": {r.shard_id: round(r.busy, 3) for r in reporting}}
        if decision.change:
            self.changes.append(self.last)

    def report(self) -> dict[str, Any]:
        return {"last": self.last, "changes": list(self.changes)}

    def _max(self, capacity: int) -> int:
        return max(self.config.max_shards or capacity, self.config.min_shards)

    async def _poll(self, handles: Mapping[int, Any], live: set[int]) -> None:
        ids = [s for s in handles if s in live]
        results = await asyncio.gather(*(asyncio.wait_for(handles[s].load.remote(), LOAD_CALL_TIMEOUT_S)
                                         for s in ids), return_exceptions=True)
        self.loads = {s: r for s, r in zip(ids, results, strict=True) if isinstance(r, ShardLoad)}

    async def _save(self, meta: MetadataStore, state: store.ScaleState) -> None:
        await store.set_scale_state(meta, state)
        self.state = state

    def _run(self, work: Awaitable[None]) -> None:
        async def guarded() -> None:
            try:
                await work
            except Exception:
                log.exception("autoscale: step failed; the next round tries again")
            finally:
                self.settled_at = time.monotonic()

        self._task = asyncio.ensure_future(guarded())

    async def _balance(self, meta: MetadataStore, shards: list[int], hand_off: HandOff, by_load: bool) -> None:
        """Group slots by count; partitions by measured load, but only when it pays: a shard runs above the target
        (`by_load`, the policy's rebalance) or one holds no partition (a new one). Among shards under the target
        every move would only chase the busy readings' jitter, and each pauses its partition's producers."""
        parts = store.partition_assignment(await store.topics(meta))
        moves = []
        if by_load or not set(shards) <= set(parts.values()):
            busy: dict[tuple[str, int], float] = {}
            for s in shards:
                busy.update(self.loads[s].partition_busy())
            moves = balance_by_load(parts, busy, shards, self.config.moves_in_flight)
        moves += balance(store.slot_assignment(await store.group_slots(meta)), shards)
        if moves:
            log.info("autoscale: balancing by load: %d move(s)", len(moves))
            self.metrics.moved(len(await hand_off(moves)))

    async def _remove(self, meta: MetadataStore, leaving: list[int], remaining: list[int], hand_off: HandOff,
                      forget: Callable[[int], Awaitable[None]]) -> None:
        """Scale down: nothing new lands on the leaving shards, their work moves off, then they stop."""
        moved = await drain_shards(meta, set(leaving), remaining, hand_off)
        if moved:
            self.metrics.moved(len(moved))
        held = set(store.partition_assignment(await store.topics(meta)).values())
        held |= set(store.slot_assignment(await store.group_slots(meta)).values())
        for shard in leaving:
            if shard in held:
                log.warning("autoscale: shard %d still holds work after its drain; trying again", shard)
                return
            await forget(shard)
            log.warning("autoscale: shard %d drained and stopped", shard)
        await store.set_draining(meta, await store.draining(meta) - set(leaving))
        await self._save(meta, store.ScaleState(self.state.desired, (), self.state.reason))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


def _items_by_shard(assignment: Mapping[Any, int], shards: list[int]) -> dict[int, list[Any]]:
    items: dict[int, list[Any]] = {s: [] for s in shards}
    for item, shard in assignment.items():
        if shard in items:
            items[shard].append(item)
    return items


class _ScaleMetrics:
    """The decisions as Ray metrics (the Ray dashboard and its Prometheus endpoint show them)."""

    def __init__(self) -> None:
        self._gauges: dict[str, Any] = {}
        self._moves: Any = None

    def _gauge(self, name: str, doc: str) -> Any:
        if name not in self._gauges:
            from ray.util import metrics

            self._gauges[name] = metrics.Gauge(name, description=doc)
        return self._gauges[name]

    def set(self, decision: Decision, actual: int) -> None:
        with contextlib.suppress(Exception):
            self._gauge("kafscale_autoscale_desired_shards", "Shards the autoscaler wants").set(decision.desired)
            self._gauge("kafscale_autoscale_shards", "Shards running (not being removed)").set(actual)

    def moved(self, count: int) -> None:
        with contextlib.suppress(Exception):
            if self._moves is None:
                from ray.util import metrics

                self._moves = metrics.Counter("kafscale_autoscale_moves", description="Moves made by autoscaling")
            self._moves.inc(count)
