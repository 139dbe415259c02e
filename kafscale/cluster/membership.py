"""A shard's membership of the cluster: its registration under a lease, and its view of who else is live.

Registration: `cluster/brokers/{id}` is written under a lease of `lease_ttl_s` (LEASE_TTL_S unless the operator
sets it) that the shard renews four times per TTL. If the shard dies, or cannot reach the metadata store, the
lease lapses, the key vanishes and the controller moves the shard's partitions and groups away.

Serving is itself leased: the shard stops serving (`on_lost`) once SERVE_FRACTION of the TTL has passed
since the start of its last successful renewal. The store counts the TTL from when that renewal arrived, so
a cut-off shard has stopped before its key can vanish and before any successor is named: two shards never
both serve one partition. It then reads the topics and the cluster view again (work may have moved while
it was cut off) and registers again under a new lease.

The view: every key under `cluster/` (live shards and the group slot map) is loaded, then followed by a
watch, into the shard's Placement; `on_change` runs after each change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass

from kafscale.cluster import keys
from kafscale.cluster.lease_renewal import RenewalThread, Renewer
from kafscale.cluster.placement import Placement, ShardAddress
from kafscale.storage.metadata_store import MetadataStore

log = logging.getLogger(__name__)

# The TTL is most of the time a lost node's partitions are unserved (3.1-5.4 s here, clients included; 4 s made
# it 5-8.7 s). The price: a shard whose loop or metadata store stalls for 2.4 s stops serving and its work
# moves, which was seen with two test suites and a benchmark sharing this 2-core machine, and with 50 consumer
# processes and a producer on it (load 11). Operators of such hosts raise it (`lease_ttl_s`).
LEASE_TTL_S = 3.0
RENEWALS_PER_TTL = 4
SERVE_FRACTION = 0.8
RETRY_S = 0.5


@dataclass(frozen=True, slots=True)
class BrokerRecord:
    """A live shard as the cluster sees it (the value of cluster/brokers/{id})."""

    id: int
    host: str
    port: int
    node_id: str = ""
    node_ip: str = ""
    pid: int = 0
    started_ms: int = 0
    listeners: tuple[tuple[str, str, int], ...] = ()  # (name, advertised host, port) of every listener

    @property
    def address(self) -> ShardAddress:
        listeners = tuple((str(n), str(h), int(p)) for n, h, p in self.listeners)  # lists, as stored
        return ShardAddress(self.id, self.host, self.port, listeners)

    @classmethod
    def from_value(cls, v: dict[str, object]) -> BrokerRecord:
        return cls(**{k: v[k] for k in cls.__dataclass_fields__ if k in v})  # type: ignore[arg-type]


def apply_view(placement: Placement, brokers: dict[int, BrokerRecord], slots: list[int] | None,
               draining: set[int] | None = None) -> None:
    placement.shards = sorted((b.address for b in brokers.values()), key=lambda s: s.id)
    placement.group_slots = slots
    placement.draining = set(draining or ())


class Membership:
    def __init__(self, meta: MetadataStore, placement: Placement, *, on_change: Callable[[], None],
                 on_lost: Callable[[], Awaitable[None]], resync: Callable[[], Awaitable[object]],
                 renewals: RenewalThread | None = None, lease_ttl_s: float = LEASE_TTL_S) -> None:
        self.meta = meta
        self.lease_ttl_s = lease_ttl_s
        self.keepalive_s = lease_ttl_s / RENEWALS_PER_TTL
        # Renewals on a thread of their own (a shard's: its loop may be busy with its data path), or on this loop.
        self.renewals = renewals
        self.placement = placement
        self.on_change = on_change
        self.on_lost = on_lost
        self.resync = resync  # the shard's other views of the store, read again before it serves again
        self.brokers: dict[int, BrokerRecord] = {}
        self.slots: list[int] | None = None
        self.draining: set[int] = set()
        self.record: BrokerRecord | None = None
        self.lease = 0
        self._registered = False  # under a lease this shard holds, until it lapses or is revoked
        self._serve_until = 0.0  # time.monotonic() after which serving is no longer safe (renewals move it)
        self._renewed_at = 0.0  # when the last successful renewal was sent
        self._renewer: Renewer | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def serving(self) -> bool:
        """Registered, and within SERVE_FRACTION of the TTL since the last renewal that succeeded: read from the
        clock, so a late timer or a busy loop never stretches it."""
        return self._registered and time.monotonic() < self._serve_until

    async def load(self) -> int:
        """The view as the store holds it now; returns the revision to watch from."""
        revision = await self.meta.revision()
        brokers: dict[int, BrokerRecord] = {}
        slots = None
        self.draining = set()
        for kv in await self.meta.range(keys.CLUSTER_PREFIX):
            if kv.key.startswith(keys.BROKERS):
                record = BrokerRecord.from_value(kv.value)
                brokers[record.id] = record
            elif kv.key == keys.GROUP_SLOTS:
                slots = list(kv.value["slots"])
            elif kv.key == keys.DRAINING:
                self.draining = set(kv.value["shards"])
        self.brokers, self.slots = brokers, slots
        apply_view(self.placement, brokers, slots, self.draining)
        return revision + 1

    async def start(self, record: BrokerRecord) -> None:
        """Register (so the cluster sees this shard as live) and follow the cluster's view."""
        self.record = record
        revision = await self.load()
        await self._register()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._follow(revision)), loop.create_task(self._keep_serving())]
        if self.renewals is not None:
            self._renewer = self.renewals.start(self._held_lease, self._answered, self.keepalive_s, self.lease_ttl_s)
        else:
            self._renewer = Renewer(lambda: self.meta, self._held_lease, self._answered, self.keepalive_s,
                                   self.lease_ttl_s)
            self._tasks.append(loop.create_task(self._renewer.run()))

    async def stop(self) -> None:
        """Leave: the key goes at once, so the controller moves this shard's work without waiting for a TTL."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        self._registered = False
        if self.lease:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.meta.lease_revoke(self.lease), 2)
            self.lease = 0

    async def _register(self) -> None:
        assert self.record is not None
        started = time.monotonic()
        lease = await self.meta.lease_grant(self.lease_ttl_s)
        await self.meta.put(keys.broker(self.record.id), asdict(self.record), lease=lease)
        self.lease = lease
        self._renewed(started)
        self._registered = True
        self.brokers[self.record.id] = self.record
        apply_view(self.placement, self.brokers, self.slots, self.draining)
        log.info("shard %d registered at %s:%d (lease %x)", self.record.id, self.record.host, self.record.port, lease)

    def _renewed(self, started: float) -> None:
        """A renewal sent at `started` succeeded: serving is safe until SERVE_FRACTION of the TTL after it (the
        store counts the TTL from when the renewal arrived, which is later)."""
        self._renewed_at = started
        self._serve_until = max(self._serve_until, started + self.lease_ttl_s * SERVE_FRACTION)

    def _held_lease(self) -> int:
        return self.lease if self._registered else 0

    def _answered(self, lease: int, sent: float, alive: bool) -> None:
        """A renewal's answer, on the renewal thread: only floats are written (atomic), the loop reads them."""
        if lease != self.lease:
            return  # for a lease given up since
        if alive:
            self._renewed(sent)
        else:
            self._serve_until = 0.0  # the store has let it go

    def _expired(self) -> None:
        """Serving has stopped (the clock passed the deadline): the shard is told, and registers again."""
        if not self._registered:
            return
        self._registered = False
        now = time.monotonic()
        # Which stalled: the renewal (its call still out), or the renewals' loop itself.
        out = self._renewer.out_since if self._renewer is not None else None
        pending = f"{now - out:.2f} s" if out is not None else "none"
        log.warning("shard %s: lease not renewed in time (last renewal sent %.2f s ago, one out for %s); no longer "
                    "serving until registered again", self.record.id if self.record else "?",
                    now - self._renewed_at, pending)
        task = asyncio.get_running_loop().create_task(self.on_lost())
        self._tasks.append(task)

    async def _keep_serving(self) -> None:
        """Tells the shard when its lease has lapsed, and registers again after that."""
        while True:
            await asyncio.sleep(self.keepalive_s)
            try:
                if self.serving:
                    continue
                self._expired()
                # Back after a lapse: while cut off, work may have moved away, and the watches that say so may
                # still be catching up. Serving on the old view would fence the successors for nothing.
                await self.resync()
                await self.load()
                await self._register()
                self.on_change()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the store is unreachable: not serving, and trying again
                log.warning("shard %s: could not register again: %s", self.record.id if self.record else "?", e)

    async def _follow(self, revision: int) -> None:
        while True:
            try:
                async for event in self.meta.watch(keys.CLUSTER_PREFIX, start_revision=revision):
                    revision = event.mod_revision + 1
                    if event.key.startswith(keys.BROKERS):
                        shard_id = int(event.key[len(keys.BROKERS):])
                        if event.type == "put":
                            self.brokers[shard_id] = BrokerRecord.from_value(event.value)
                        else:
                            self.brokers.pop(shard_id, None)
                    elif event.key == keys.GROUP_SLOTS:
                        self.slots = list(event.value["slots"]) if event.type == "put" else None
                    elif event.key == keys.DRAINING:
                        self.draining = set(event.value["shards"]) if event.type == "put" else set()
                    else:
                        continue
                    apply_view(self.placement, self.brokers, self.slots, self.draining)
                    self.on_change()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a gap (store down, history compacted): read the whole view again
                log.warning("cluster watch interrupted: %s", e)
                await asyncio.sleep(RETRY_S)
                with contextlib.suppress(Exception):
                    revision = await self.load()
                    if self.record is not None and self.serving:
                        self.brokers[self.record.id] = self.record
                        apply_view(self.placement, self.brokers, self.slots, self.draining)
                    self.on_change()
