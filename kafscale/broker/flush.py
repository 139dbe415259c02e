"""The flush: how one partition owner's buffered batches become committed segments.

Everything buffered within one flush window becomes one segment (group commit). The loop seals the open
window when its time is up (or the owner closes), uploads sealed segments with conditional creates, up to
`uploads_in_flight` at once, and commits them strictly in offset order: every segment whose upload has
finished, from the oldest on, goes into one metadata transaction guarded by the owner key's revision
(fencing). Only then do the high watermark advance, acks=all producers get their answers and readers wake.
An upload whose commit never happens is an uncommitted leftover, which readers never see and a successor
writes around. These are functions over the owner's state: the owner (kafscale.broker.partition_owner) holds
it all, and its append path fills the windows this drains.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kafscale.broker.packer import PackPlace
from kafscale.broker.producer_state import ProducerEntry
from kafscale.broker.segment_upload import upload_segment
from kafscale.cluster import keys
from kafscale.cluster.records import AbortedTxn, SegmentMeta
from kafscale.storage.backoff import Backoff
from kafscale.storage.metadata_store import MAX_TXN_OPS, Compare, Put
from kafscale.storage.segment import BuiltSegment, build_segment

if TYPE_CHECKING:
    from kafscale.broker.partition_owner import PartitionOwner

log = logging.getLogger("kafscale.broker.partition_owner")  # the owner's log: its flush is part of its story


class FencedError(Exception):
    """Another owner incarnation took the partition over; this one must stop writing."""


@dataclass(slots=True)
class Pending:
    """Batches of one flush window, becoming one segment."""

    chunks: list[bytearray] = field(default_factory=list)
    nbytes: int = 0
    first_offset: int = -1
    last_offset: int = -1
    started: float = 0.0
    # Each producer's state as of this window's last batch: what its commit persists. A snapshot, not
    # the live entry, which already holds later (uncommitted) batches by the time this one commits.
    producers: dict[int, ProducerEntry] = field(default_factory=dict)
    plain: bool = False  # it holds batches without a producer id
    waiters: list[asyncio.Future[None]] = field(default_factory=list)
    upload: asyncio.Task[Uploaded] | None = None  # started once sealed, within the in-flight limit
    aborted: list[AbortedTxn] = field(default_factory=list)  # the transactions this window's markers abort
    due_now: bool = False  # its producers can send nothing more until answered: waiting longer gains nothing


@dataclass(frozen=True, slots=True)
class Uploaded:
    built: BuiltSegment
    key_epoch: int
    started: float  # monotonic time the upload began, for the flush-duration metric
    packed: PackPlace | None = None  # a virtual partition's segment: where in which pack
    aborted: tuple[AbortedTxn, ...] = ()

    def meta(self) -> SegmentMeta:
        """The segment record its commit writes."""
        if self.packed is None:
            return SegmentMeta.from_info(self.built.info, self.key_epoch, aborted=self.aborted)
        return SegmentMeta.from_info(self.built.info, 0, self.packed.pack, self.packed.position,
                                     self.packed.index_size, self.aborted)


async def flush_loop(owner: PartitionOwner) -> None:
    """Seal the open window when its time is up, keep uploads going, commit finished ones in order.

    The timer seals only while no earlier segment is still uploading: when the store is the
    bottleneck the open segment keeps filling (up to segment.bytes) instead of queueing one small
    object per interval, so the request count per MiB falls as the store slows down. Its records
    lose nothing by the wait, as they could not commit before the earlier segment anyway.

    A window marked due now (PartitionOwner.flush_now: its producers are blocked on their answers) seals without
    waiting for the timer once it holds blocked_flush_min_bytes: the rest of the interval would add none of their
    data, only latency. A smaller one keeps the interval, so a slow producer's records still share objects.
    """
    interval = owner.settings.flush_interval_ms / 1000.0
    ticks = owner.packer is not None and owner.packer.ticks
    # The deadlines are on the loop's clock (the monotonic one; uvloop's in whole milliseconds), and so is the
    # check that one has passed: a timer never fires "early" by the other clock's reading.
    loop = asyncio.get_running_loop()
    while not owner.fenced:
        owner._wake.clear()
        uploading = _uploading(owner)
        due_at = _due_at(owner._open.started, interval, ticks)
        if owner._open.chunks and (owner.closed or (not uploading and (
                (owner._open.due_now and owner._open.nbytes >= owner.settings.blocked_flush_min_bytes)
                or loop.time() >= due_at))):
            owner._seal()
        _start_uploads(owner)
        if owner._sealed and owner._sealed[0].upload is not None and owner._sealed[0].upload.done():
            try:
                await commit_uploaded(owner)
            except FencedError as e:
                log.warning("%s-%d fenced: %s", owner.topic, owner.partition, e)
                owner.stop_writing()
            except Exception:  # a bug, not store trouble (both steps retry that): stop rather than hang
                log.exception("flush of %s-%d failed", owner.topic, owner.partition)
                owner.stop_writing()
            continue
        if owner.closed and not owner._sealed and not owner._open.chunks:
            return
        deadline = None  # an upload finishing wakes the loop
        if owner._open.chunks and not uploading:
            # The loop's clock is the monotonic one: every partition waiting for one tick gets the very same
            # deadline, so their timers fire in one turn of the loop and their segments reach the pack together.
            deadline = _due_at(owner._open.started, interval, ticks)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(deadline):
                await owner._wake.wait()


def _due_at(started: float, interval: float, ticks: bool) -> float:
    """When a window opened at `started` is due: an interval later, or, for a plain topic's packed partition,
    at the next tick (a multiple of the interval on the monotonic clock). Every partition of the shard shares
    the ticks, so the segments of one tick go up as one pack; a record waits half an interval on average."""
    return (started // interval + 1) * interval if ticks else started + interval


def _uploading(owner: PartitionOwner) -> bool:
    return any(p.upload is None or not p.upload.done() for p in owner._sealed)


def _start_uploads(owner: PartitionOwner) -> None:
    for pending in itertools.islice(owner._sealed, owner.settings.uploads_in_flight):
        if pending.upload is None:
            if owner.packer is not None and owner.packer.ticks:
                owner.packer.coming(owner.partition)
            pending.upload = asyncio.get_running_loop().create_task(_upload_pending(owner, pending))
            pending.upload.add_done_callback(lambda _: owner._wake.set())


async def _upload_pending(owner: PartitionOwner, pending: Pending) -> Uploaded:
    """Build and upload one sealed segment; retries store errors until it lands or the owner stops."""
    built = build_segment(pending.chunks, created_ms=int(time.time() * 1000),
                          index_interval_bytes=owner.settings.index_interval_bytes)
    started = time.monotonic()
    backoff = Backoff(0.05, 2.0)
    while True:
        try:
            aborted = tuple(pending.aborted)
            if owner.packer is not None:
                return Uploaded(built, 0, started, await owner.packer.upload(owner.partition, owner.epoch, built),
                                aborted)
            key_epoch = await upload_segment(owner.objects, owner.settings.namespace, owner.topic, owner.partition,
                                             owner.epoch, built.info.base_offset, built.data, built.index)
            return Uploaded(built, key_epoch, started, None, aborted)
        except Exception as e:  # store trouble: keep the data, retry with back-off
            if owner.fenced or (owner.closed and backoff.at_cap):
                raise FencedError(f"giving up upload at {built.info.base_offset}: {e}") from e
            log.warning("upload of %s-%d at %d failed (%s); retrying in %.2fs", owner.topic, owner.partition,
                        built.info.base_offset, e, backoff.delay)
            await backoff.wait()


async def commit_uploaded(owner: PartitionOwner) -> None:
    """Commit, in one transaction, every sealed segment from the oldest on whose upload has finished;
    then publish them and answer their producers."""
    ready: list[tuple[Pending, Uploaded]] = []
    ops = 0
    for pending in owner._sealed:
        if pending.upload is None or not pending.upload.done():
            break
        if ready and (pending.upload.cancelled() or pending.upload.exception() is not None):
            break  # only the oldest segment's failure stops the owner
        ops += 1 + len(pending.producers)
        if ready and ops > MAX_TXN_OPS:  # later segments wait; one alone always goes
            break
        ready.append((pending, pending.upload.result()))  # an upload that gave up raises here
    backoff = Backoff(0.05, 2.0)
    while True:
        try:
            await _commit(owner, ready)
            break
        except FencedError:
            raise
        except Exception as e:  # store trouble: keep the data, retry with back-off
            if owner.closed and backoff.at_cap:
                raise FencedError(f"giving up flush on close: {e}") from e
            log.warning("commit of %s-%d at %d failed (%s); retrying in %.2fs", owner.topic, owner.partition,
                        ready[0][1].built.info.base_offset, e, backoff.delay)
            await backoff.wait()
    now = time.monotonic()
    for pending, uploaded in ready:
        owner._sealed.popleft()
        owner._sealed_bytes -= pending.nbytes
        meta = uploaded.meta()
        owner.segments.append(meta)
        owner.high_watermark = meta.last + 1
        owner.reader.cache_built(meta, uploaded.built)
        if owner.metrics is not None:
            owner.metrics.flushed(pending.nbytes, pending.last_offset - pending.first_offset + 1,
                                 len(uploaded.built.data), now - uploaded.started)
        if uploaded.aborted or owner.txns.has_ending:
            owner.txns.committed(owner.high_watermark, list(uploaded.aborted))
        for fut in pending.waiters:
            if not fut.done():
                fut.set_result(None)
    owner._space.set()
    owner._notify_readers()


async def _commit(owner: PartitionOwner, ready: list[tuple[Pending, Uploaded]]) -> None:
    async with owner.state_lock:  # log_start_offset must not move between reading and writing it
        await _commit_locked(owner, ready)


async def _commit_locked(owner: PartitionOwner, ready: list[tuple[Pending, Uploaded]]) -> None:
    next_offset = ready[-1][1].built.info.last_offset + 1
    state = {"next_offset": next_offset, "log_start_offset": owner.log_start_offset, "epoch": owner.epoch}
    ops = [Put(keys.state(owner.topic, owner.partition), state)]
    producers: dict[int, ProducerEntry] = {}
    for pending, uploaded in ready:
        info = uploaded.built.info
        ops.append(Put(keys.segment(owner.topic, owner.partition, info.base_offset), uploaded.meta().to_value()))
        producers.update(pending.producers)  # later windows carry the later state
    for pid, entry in producers.items():
        ops.append(Put(keys.producer(owner.topic, owner.partition, pid), entry.to_value()))
    guard = [Compare(keys.owner(owner.topic, owner.partition), "mod_revision", "==", owner.owner_revision)]
    try:
        if owner.committer is not None:
            packs = [uploaded.packed.pack for _, uploaded in ready if uploaded.packed is not None]
            succeeded = await owner.committer.commit(guard, ops, packs, (owner.topic, owner.partition))
        else:
            succeeded = (await owner.meta.txn(guard, ops)).succeeded
    except Exception:
        # The commit may have been applied and only the reply lost: look before retrying. Only
        # this incarnation writes its epoch, so this state can only come from this very commit.
        current = await owner.meta.get(keys.state(owner.topic, owner.partition))
        if (current is not None and current.value.get("epoch") == owner.epoch
                and current.value["next_offset"] == next_offset):
            return
        raise
    if not succeeded:
        raise FencedError(f"commit of {owner.topic}-{owner.partition} refused: epoch {owner.epoch} is stale")
