"""Segments sealed within a moment go up as one pack object: a physical partition's, or a plain topic's on one shard.

A topic with virtual partitions stores P physical partitions (docs/virtual-partitions.md): each virtual partition
("lane") keeps its own owner, offsets and commits, but the segments its lanes seal at about the same time are
stored together, one conditional PUT instead of one a lane. A plain topic's partitions on one shard are lanes
the same way (`pack_segments`): their flush windows end on the same ticks (kafscale.broker.flush), so each tick's
segments make one object, and the object-store requests follow time, not partitions. The first segment to arrive
opens a window of `window_s`; every lane sealing within it joins; a lane's next segment waits for the next pack.
A failed PUT fails every lane's upload, and each lane's flush retries it as it retries any upload (joining a
later pack). Once a pack is stored its lanes' commits are announced to the shard's commit batcher, which sends
them as one transaction.

Each pack gets a fresh random name, so no two uploads ever write one key: a zombie owner's pack can only be
garbage, which the janitor removes once no commit names it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from kafscale.storage import keys as object_keys
from kafscale.storage.async_store import AsyncObjectStore
from kafscale.storage.object_store import ObjectStoreError
from kafscale.storage.pack import build_pack
from kafscale.storage.segment import BuiltSegment

# A plain topic's pack waits this fraction of the flush interval (at most TICK_GATHER_MAX_S) after the first
# segment of a tick arrives: the tick's other segments are being built, one after another, on the same loop.
TICK_GATHER = 0.2
TICK_GATHER_MAX_S = 0.025


@dataclass(frozen=True, slots=True)
class PhysicalPartition:
    """Which partitions share a partition's packs: a virtual partition's physical partition (its index, its virtual
    partitions, the topic's (P, V)), or a plain topic's partitions (index None, all partitions, (0, partitions))."""

    index: int | None
    lanes: list[int]
    layout: tuple[int, int]


@dataclass(frozen=True, slots=True)
class PackPlace:
    """Where an uploaded lane segment lies: the pack's name (keys.pack_name), its position, its index size."""

    pack: str
    position: int
    index_size: int


class Packer:
    def __init__(self, objects: AsyncObjectStore, namespace: str, topic: str, physical: int | None, lanes: list[int],
                 layout: tuple[int, int], window_s: float,
                 announce: Callable[[str, list[tuple[str, int]]], None] | None = None) -> None:
        self.objects, self.namespace, self.topic, self.physical = objects, namespace, topic, physical
        # A plain topic's lanes seal on the shard's shared ticks (kafscale.broker.flush) and say so as they seal
        # (`coming`); a virtual topic's seal on their own clocks, and their pack waits out its window for them.
        self.ticks = physical is None
        self.lanes = lanes  # the partitions whose segments may be in these packs
        self.layout = layout  # the topic's (physical, virtual) partition counts, recorded in every pack
        self.window_s = window_s
        self.announce = announce  # (pack, its lanes as (topic, partition)) before they learn where their segments went
        self.packs = 0  # packs stored, for tests and the bench
        self._waiting: dict[int, tuple[int, BuiltSegment, asyncio.Future[PackPlace]]] = {}
        self._closed: asyncio.Future[None] | None = None  # resolves when the open window closes
        # On ticks, lanes seal together (on a tick, or blocked producers' windows at once) and say so: the window
        # closes as soon as every lane that said so has arrived, not at the end of its time.
        self._coming: set[int] = set()
        self._complete: asyncio.Future[None] | None = None  # resolves when nothing more is coming
        self._storing: set[asyncio.Task[None]] = set()  # held: the loop keeps only weak references to tasks

    def coming(self, lane: int) -> None:
        """The lane has sealed a segment, which it is building for the open window (or the next one)."""
        if lane not in self._waiting:
            self._coming.add(lane)

    async def upload(self, lane: int, epoch: int, built: BuiltSegment) -> PackPlace:
        """Store one lane's sealed segment (and its index) in the next pack, as written by the lane's owner of
        `epoch`; where it went."""
        while lane in self._waiting:  # this lane's previous segment is in the open window: the next one
            assert self._closed is not None
            await asyncio.shield(self._closed)  # not its PUT: a lane keeps several uploads in flight
        loop = asyncio.get_running_loop()
        placed: asyncio.Future[PackPlace] = loop.create_future()
        placed.add_done_callback(_retrieved)  # a lane closed meanwhile never awaits its failure
        self._waiting[lane] = (epoch, built, placed)
        if self._closed is None:
            self._closed, self._complete = loop.create_future(), loop.create_future()
            task = loop.create_task(self._store_after(self.window_s, self._complete))
            self._storing.add(task)
            task.add_done_callback(self._storing.discard)
        self._coming.discard(lane)
        if self.ticks and self._complete is not None and not self._coming and not self._complete.done():
            self._complete.set_result(None)
        return await placed

    def _close_window(self) -> dict[int, tuple[int, BuiltSegment, asyncio.Future[PackPlace]]]:
        waiting, self._waiting = self._waiting, {}
        closed, self._closed, self._complete = self._closed, None, None
        self._coming.clear()  # a lane that said so and has not arrived joins the next window
        if closed is not None and not closed.done():
            closed.set_result(None)
        return waiting

    async def _store_after(self, delay: float, complete: asyncio.Future[None]) -> None:
        waiting: dict[int, tuple[int, BuiltSegment, asyncio.Future[PackPlace]]] = {}
        try:
            await asyncio.wait([complete], timeout=delay)
            waiting = self._close_window()
            physical, virtual = self.layout
            if not physical:  # a plain topic's partitions: some may be newer than the count this packer was made with
                virtual = max(virtual, max(waiting) + 1)
            pack = build_pack([(lane, epoch, built) for lane, (epoch, built, _) in sorted(waiting.items())],
                              physical, virtual)
            name = object_keys.pack_name(self.physical, uuid.uuid4().hex)
            key = object_keys.pack_key(self.namespace, self.topic, name)
            if not await self.objects.put_if_absent(key, pack.data):
                raise ObjectStoreError(f"{key} exists, yet its name is new")
            self.packs += 1
            if self.announce is not None:
                self.announce(name, [(self.topic, lane) for lane, (_, _, placed) in waiting.items()
                                     if not placed.done()])
            for p in pack.lanes:
                _, _, placed = waiting[p.lane]
                if not placed.done():
                    placed.set_result(PackPlace(name, p.position, p.index_size))
        except BaseException as e:
            waiting = waiting or self._close_window()  # cancelled in the window: it closes all the same
            for _, _, placed in waiting.values():
                if not placed.done():
                    placed.set_exception(e if isinstance(e, Exception) else ObjectStoreError("pack upload cancelled"))
            if not isinstance(e, Exception):
                raise


def _retrieved(future: asyncio.Future[PackPlace]) -> None:
    if not future.cancelled():
        future.exception()
