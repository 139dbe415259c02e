"""A shard's log cleaner: finds its compacted partitions that are due, cleans them off the event loop, and commits
each pass's segments in place of the old ones (kafscale.compaction has the rules and the pass itself).

The pass reads and writes objects itself, in a worker (`Offload`: a thread here, a Ray task on a cluster), so the
shard's event loop never decodes a record. The swap is one metadata transaction per group of replacements, guarded
by the owner key's revision like every flush commit: a deposed owner's pass can write objects under its own keys
(`-e{epoch}-c{cleaning}`) but never commit them. The replaced objects are left to the janitor, which deletes them
once no commit names them and they are past their grace, so a reader that looked a segment up just before the swap
still finds it. The checkpoint (`partitions/{topic}/{p}/cleaner`) moves with the last group.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kafscale.broker.flush import FencedError
from kafscale.broker.stats import NO_METRICS, BrokerMetrics, CleanerFigures
from kafscale.cluster import keys
from kafscale.cluster.records import SegmentMeta
from kafscale.compaction.cleaner import Job, Outcome, Replacement, clean
from kafscale.compaction.policy import CompactionConfig, Plan, due, plan
from kafscale.storage.metadata_store import MAX_TXN_OPS, Compare, Delete, Op, Put
from kafscale.storage.object_store import ObjectStore

if TYPE_CHECKING:
    from kafscale.broker.partition_owner import PartitionOwner

log = logging.getLogger(__name__)

# Runs `clean(job, read, write)` somewhere with a CPU to spare and returns its outcome.
Offload = Callable[[Job, ObjectStore], Awaitable[Outcome]]


@dataclass(frozen=True, slots=True)
class CleanerSettings:
    interval_s: float = 15.0
    map_entries: int = 1_000_000


# A pass in a Ray task yields the CPU to the shards on its node: a produce request waits for no cleaning. At nice 10
# the pass still took about a tenth of a contended core and moved the produce p99 by 12 %; at 19 it gets what the
# shards leave (compaction is background work: Kafka throttles its cleaner's I/O instead).
PASS_NICENESS = 19


def run_in_thread(job: Job, store: ObjectStore) -> Awaitable[Outcome]:
    return asyncio.to_thread(clean_with_store, job, store)


def clean_at_low_priority(job: Job, store: ObjectStore) -> Outcome:
    """clean_with_store in a thread of its own at nice PASS_NICENESS (Linux sets a nice value per thread; the calling
    thread keeps its own): what a Ray task, a process of its own, runs. Not for a thread in a shard's process: a
    descheduled low-priority thread holding the GIL would hold the event loop back with it."""
    done: list[Outcome] = []
    failed: list[BaseException] = []

    def run() -> None:
        with contextlib.suppress(OSError):  # a platform without per-thread priorities runs it at the same one
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), PASS_NICENESS)
        try:
            done.append(clean_with_store(job, store))
        except BaseException as e:
            failed.append(e)

    thread = threading.Thread(target=run, name=f"cleaning {job.topic}-{job.partition}", daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return done[0]


def clean_with_store(job: Job, store: ObjectStore) -> Outcome:
    """The pass against a blocking object store: what a worker thread or a Ray task runs."""

    def read(meta: SegmentMeta) -> bytes:
        at = meta.stored(job.namespace, job.topic, job.partition)
        return store.get(at.key) if at.whole else store.get_range(at.key, at.start, at.size)

    def write(key: str, data: bytes) -> None:
        if not store.put_if_absent(key, data):
            raise FileExistsError(f"cleaning output {key} already exists")

    return clean(job, read, write)


async def run(owners: Callable[[], Iterable[PartitionOwner]], settings: CleanerSettings, offload: Offload,
              metrics: BrokerMetrics = NO_METRICS) -> None:
    """One loop per shard, over every owner it hosts; one pass at a time, so a shard's cleaning takes one CPU."""
    while True:
        await asyncio.sleep(settings.interval_s)
        for owner in list(owners()):
            if owner.closed or owner.fenced:
                continue
            try:
                await clean_if_due(owner, settings, offload, metrics=metrics)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # store trouble, a fenced commit: the next round tries again
                log.warning("cleaning of %s-%d failed: %s", owner.topic, owner.partition, e)


async def checkpoint(owner: PartitionOwner) -> int:
    """Where the partition's dirty part starts: the last pass's end, or the log start."""
    kv = await owner.meta.get(keys.cleaner(owner.topic, owner.partition))
    return max(int(kv.value["first_dirty"]) if kv is not None else 0, owner.log_start_offset)


def compaction_config(owner: PartitionOwner) -> CompactionConfig:
    return CompactionConfig.of_topic(owner.topic_config(), owner.settings.segment_bytes)


async def assess(owner: PartitionOwner, config: CompactionConfig, now_ms: int) -> Plan:
    return plan(owner.segments, owner.log_start_offset, await checkpoint(owner), owner.last_stable_offset, now_ms,
                config)


async def clean_if_due(owner: PartitionOwner, settings: CleanerSettings, offload: Offload = run_in_thread,
                       now_ms: int | None = None, force: bool = False,
                       metrics: BrokerMetrics = NO_METRICS) -> Outcome | None:
    """Clean the partition if its topic is compacted and the pass is due (or `force`): the pass's outcome."""
    config = compaction_config(owner)
    if not config.compact:
        return None
    now = int(time.time() * 1000) if now_ms is None else now_ms
    p = await assess(owner, config, now)
    figures = CleanerFigures(owner.topic, owner.partition, p.dirty_ratio, p.dirty_bytes,
                             max(0.0, (now - config.max_lag_ms - p.oldest_dirty_ms) / 1000) if p.dirty_bytes else 0.0)
    if not p.segments or not (force or due(p, config)):
        metrics.cleaner(figures)
        return None
    job = Job(owner.settings.namespace, owner.topic, owner.partition, owner.epoch, now, p.segments, p.first_dirty,
              tuple(owner.txns.aborted), now, config.delete_retention_ms, config.segment_bytes, settings.map_entries,
              owner.settings.index_interval_bytes)
    owner.cleaning = True
    try:
        outcome = await offload(job, owner.objects.store)
        await swap(owner, outcome, job)
    finally:
        owner.cleaning = False
    stats = outcome.stats
    before = sum(old.size for r in outcome.replacements for old in r.old)
    after = sum(r.new.size for r in outcome.replacements)
    left = await assess(owner, config, now)  # the gauges say what is dirty now, not what was
    metrics.cleaner(dataclasses.replace(figures, dirty_ratio=left.dirty_ratio, dirty_bytes=left.dirty_bytes,
                                        cleaned=True, bytes_read=stats.bytes_read, bytes_written=stats.bytes_written,
                                        bytes_reclaimed=before - after, records_removed=stats.records_removed,
                                        seconds=stats.seconds))
    log.info("%s-%d cleaned to %d: %d of %d records removed, %d bytes read, %d written, %.2f s", owner.topic,
             owner.partition, outcome.cleaned_to, stats.records_removed, stats.records_read, stats.bytes_read,
             stats.bytes_written, stats.seconds)
    return outcome


async def swap(owner: PartitionOwner, outcome: Outcome, job: Job) -> None:
    """Commit the pass: each replacement whose old segments are all still committed (retention may have dropped
    some meanwhile: that group's new objects are left as garbage), then the checkpoint."""
    async with owner.state_lock:
        if owner.fenced or owner.closed:
            raise FencedError(f"{owner.topic}-{owner.partition} changed owner during its cleaning")
        committed = set(owner.segments)
        live = [r for r in outcome.replacements if committed.issuperset(r.old)]
        guard = [Compare(keys.owner(owner.topic, owner.partition), "mod_revision", "==", owner.owner_revision)]
        marker = Put(keys.cleaner(owner.topic, owner.partition),
                     {"first_dirty": outcome.cleaned_to, "cleaning": job.cleaning, "cleaned_ms": job.now_ms})
        chunks = _chunks(owner, live, MAX_TXN_OPS - len(guard) - 1)
        for i, (replacements, ops) in enumerate(chunks):
            if i == len(chunks) - 1:
                ops.append(marker)
            if not (await owner.meta.txn(guard, ops)).succeeded:
                owner.stop_writing()
                raise FencedError(f"cleaning of {owner.topic}-{owner.partition} refused: epoch is stale")
            _apply(owner, replacements)


def _chunks(owner: PartitionOwner, replacements: list[Replacement], room: int
            ) -> list[tuple[list[Replacement], list[Op]]]:
    """The replacements in transactions of at most `room` operations each (etcd's limit); at least one, for the
    checkpoint. A replacement is never split: each transaction leaves a whole log."""
    chunks: list[tuple[list[Replacement], list[Op]]] = [([], [])]
    for r in replacements:
        ops: list[Op] = [Delete(keys.segment(owner.topic, owner.partition, s.base)) for s in r.old
                         if s.base != r.new.base]
        ops.append(Put(keys.segment(owner.topic, owner.partition, r.new.base), r.new.to_value()))
        if chunks[-1][1] and len(chunks[-1][1]) + len(ops) > room:
            chunks.append(([], []))
        chunks[-1][0].append(r)
        chunks[-1][1].extend(ops)
    return chunks


def _apply(owner: PartitionOwner, replacements: list[Replacement]) -> None:
    """The committed replacements, in memory: the segment list, the read cache, the aborted index."""
    if not replacements:
        return
    gone = {s for r in replacements for s in r.old}
    new = {r.old[0].base: r.new for r in replacements}
    segments: list[SegmentMeta] = []
    for s in owner.segments:
        if s in gone:
            if s.base in new:
                segments.append(new[s.base])
            owner.reader.discard(s)
        else:
            segments.append(s)
    owner.segments = segments
    owner.txns.replace_aborted([a for s in segments for a in s.aborted])
