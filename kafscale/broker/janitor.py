"""The janitor: deletes objects that no commit refers to and none ever will.

Such objects are left by an upload whose commit failed or was fenced (a dead or zombie owner's segment), by a
retention pass or DeleteRecords interrupted between its commit and its deletes, and by a topic deletion cut
short. Readers never see them (reads go through the committed segment list); they only cost storage.

Why a deletion is safe:

- **A partition's objects** are swept by its owner. An object of the partition at base offset B is garbage for
  good when it is not the committed object for B and B is below the committed end (the high watermark): commits
  only ever add segments at the end, and a fenced owner's commit fails. The committed state is read before the
  listing, so what is committed meanwhile lies at or above the end read. An object at or above the end may still
  be an upload whose commit is in flight: it is left alone. Objects also wait `grace_s` after they were written,
  for readers that looked up a segment just before retention dropped it.
- **A pack** (the objects a topic with virtual partitions stores, kafscale.storage.pack) holds segments of
  several lanes, each of which commits on its own and drops its segments on its own; a pack is swept once per
  physical partition. It is garbage for good when, for every lane its trailer lists, the lane's record at the
  segment's base does not name the pack and either the lane's committed end is past that base (commits only add
  at the end) or the lane's owner epoch is past the one that wrote the segment (that writer's commits are
  fenced). The reads go epoch, then end, then record: a commit writes the end and the record at once, under the
  epoch it was made with, so what a fenced writer committed before losing the lane is seen. Only packs no
  committed record names, and older than `grace_s`, are looked at.
- **A deleted topic's objects.** Deleting a topic writes a record (`deleted_topics/{name}`) in the same
  transaction, and no topic of that name can be made while it exists. The shard that deleted the topic deletes
  its objects at once and then the record; the janitor finishes deletions whose record is over a minute old.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kafscale.broker.packed import read_trailer
from kafscale.cluster import keys
from kafscale.storage import keys as object_keys
from kafscale.storage.async_store import AsyncObjectStore
from kafscale.storage.metadata_store import Compare, Delete, MetadataStore

if TYPE_CHECKING:
    from kafscale.broker.partition_owner import PartitionOwner

log = logging.getLogger(__name__)
TOMBSTONE_AGE_S = 60.0  # a deleted topic's record older than this: its deletion was cut short
DELETE_BATCH = 1000


@dataclass(frozen=True, slots=True)
class Sweep:
    deleted: int  # objects deleted
    in_grace: int  # garbage not yet old enough to delete


async def sweep_partition(owner: PartitionOwner, grace_s: float, now: float | None = None) -> Sweep:
    """Delete the owner's partition's objects that are garbage for good and older than grace_s."""
    if owner.cleaning:  # its new segments are not committed yet, however long the pass takes
        return Sweep(0, 0)
    ns, topic, partition = owner.settings.namespace, owner.topic, owner.partition
    end = owner.high_watermark  # read together with the segments, before the listing (see above)
    committed = {key for s in owner.segments if not s.pack
                 for key in (s.stored(ns, topic, partition).key, s.stored(ns, topic, partition).index_key)}
    listed = await owner.objects.list(object_keys.partition_prefix(ns, topic, partition))
    now = time.time() if now is None else now
    garbage = [o for o in listed if o.key not in committed and _below(o.key, (ns, topic, partition), end)]
    due = [o.key for o in garbage if now - o.modified >= grace_s]
    if due:
        # Still this partition's owner? One that has not yet seen its topic deleted (and made again) must not
        # judge the new topic's objects by the old topic's end.
        current = await owner.meta.get(keys.owner(topic, partition))
        if current is None or current.mod_revision != owner.owner_revision:
            return Sweep(0, len(garbage))
        await owner.objects.delete_many(due)
        log.info("%s-%d: janitor deleted %d uncommitted object(s) below offset %d", topic, partition, len(due), end)
    return Sweep(len(due), len(garbage) - len(due))


async def sweep_packs(meta: MetadataStore, objects: AsyncObjectStore, namespace: str, topic: str, physical: int,
                      lanes: list[int], grace_s: float, now: float | None = None) -> Sweep:
    """Delete the packs of one physical partition (its virtual partitions `lanes`) that are garbage for good."""
    listed = [(o, name) for o in await objects.list(object_keys.partition_prefix(namespace, topic, physical))
              if (name := object_keys.pack_name_of(o.key, namespace, topic)) is not None]
    if not listed:
        return Sweep(0, 0)
    named = {kv.value.get("pack") for records in await asyncio.gather(*(meta.range(keys.segments(topic, lane))
                                                                        for lane in lanes))
             for kv in records}
    now = time.time() if now is None else now
    unnamed = [(o, name) for o, name in listed if name not in named]
    due = [(o, name) for o, name in unnamed if now - o.modified >= grace_s]
    dead = []
    for o, name in due:
        try:
            if await _pack_is_dead(meta, objects, topic, o.key, o.size, name):
                dead.append(o.key)
        except Exception as e:  # one unreadable pack (damaged, or deleted meanwhile) must not stop the others
            log.warning("janitor: pack %s left alone: %s", o.key, e)
    if dead:
        await objects.delete_many(dead)
        log.info("%s (physical partition %d): janitor deleted %d pack(s) no commit names", topic, physical,
                 len(dead))
    return Sweep(len(dead), len(unnamed) - len(dead))


async def _pack_is_dead(meta: MetadataStore, objects: AsyncObjectStore, topic: str, key: str, size: int,
                        name: str) -> bool:
    for lane in (await read_trailer(objects, key, size)).lanes:
        owner = await meta.get(keys.owner(topic, lane.lane))
        state = await meta.get(keys.state(topic, lane.lane))
        record = await meta.get(keys.segment(topic, lane.lane, lane.base))
        if record is not None and record.value.get("pack") == name:
            return False
        end = int(state.value["next_offset"]) if state is not None else 0
        fenced = owner is not None and int(owner.value.get("epoch", 0)) > lane.epoch
        if lane.base >= end and not fenced:
            return False  # its commit may still be on its way
    return True


def _below(key: str, partition: tuple[str, str, int], end: int) -> bool:
    parsed = object_keys.parse_segment_key(key)
    return (parsed is not None and (parsed.namespace, parsed.topic, parsed.partition) == partition
            and parsed.base_offset < end)


async def sweep_deleted_topics(meta: MetadataStore, objects: AsyncObjectStore, namespace: str,
                               now: float | None = None) -> Sweep:
    """Finish the topic deletions the shard that made them could not (their records older than a minute)."""
    deleted = 0
    now = time.time() if now is None else now
    for kv in await meta.range(keys.DELETED_TOPICS):
        if now - int(kv.value.get("at_ms", 0)) / 1000 >= TOMBSTONE_AGE_S:
            deleted += await delete_topic_objects(meta, objects, namespace, kv.key[len(keys.DELETED_TOPICS):])
    return Sweep(deleted, 0)


async def delete_topic_objects(meta: MetadataStore, objects: AsyncObjectStore, namespace: str, name: str) -> int:
    """Delete what is stored under a deleted topic's prefix, then its record; returns how many objects went.

    While the record (`deleted_topics/{name}`) exists, no topic of that name can be made (cluster/topics.py),
    so what is listed under the prefix is the deleted topic's. The record is checked again right before the
    objects go, and removed only after they did, with a compare on its revision."""
    record = await meta.get(keys.deleted_topic(name))
    if record is None:
        return 0
    listed = [o.key for o in await objects.list(f"{namespace}/{name}/") if _in_topic(o.key, namespace, name)]
    for i in range(0, len(listed), DELETE_BATCH):
        again = await meta.get(keys.deleted_topic(name))
        if again is None or again.mod_revision != record.mod_revision:
            return i  # another deleter finished (and the name may be in use again): stop here
        await objects.delete_many(listed[i:i + DELETE_BATCH])
    await meta.txn([Compare(record.key, "mod_revision", "==", record.mod_revision)], [Delete(record.key)])
    if listed:
        log.info("deleted topic %s: %d object(s) removed", name, len(listed))
    return len(listed)


def _in_topic(key: str, namespace: str, name: str) -> bool:
    if key.endswith(f".{object_keys.PACK_SUFFIX}"):  # a pack of this topic, not of a nested namespace's topic
        return object_keys.pack_name_of(key, namespace, name) is not None
    parsed = object_keys.parse_segment_key(key)
    return parsed is None or (parsed.namespace, parsed.topic) == (namespace, name)  # a nested namespace's: no


async def run(owners: Callable[[], Iterable[PartitionOwner]], leads: Callable[[], bool], meta: MetadataStore,
              objects: AsyncObjectStore, namespace: str, interval_s: float, grace_s: float,
              report: Callable[[Sweep], None]) -> None:
    """One loop per shard over the partitions it owns; the shard for which leads() is true also finishes
    topic deletions (any shard may, and two at once are harmless: the lowest live shard id does)."""
    while True:
        await asyncio.sleep(interval_s)
        deleted = in_grace = 0
        physical: dict[tuple[str, int], list[int]] = {}  # a virtual topic's physical partitions led here
        for owner in list(owners()):
            if owner.closed or owner.fenced:
                continue
            if owner.packer is not None:
                physical.setdefault((owner.topic, owner.packer.physical), owner.packer.lanes)
            try:
                result = await sweep_partition(owner, grace_s)
                deleted, in_grace = deleted + result.deleted, in_grace + result.in_grace
            except asyncio.CancelledError:
                raise
            except Exception as e:  # store trouble: the next round tries again
                log.warning("janitor: %s-%d failed: %s", owner.topic, owner.partition, e)
        for (topic, unit), lanes in physical.items():
            try:
                result = await sweep_packs(meta, objects, namespace, topic, unit, lanes, grace_s)
                deleted, in_grace = deleted + result.deleted, in_grace + result.in_grace
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("janitor: packs of %s (physical partition %d) failed: %s", topic, unit, e)
        if leads():
            try:
                deleted += (await sweep_deleted_topics(meta, objects, namespace)).deleted
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("janitor: deleted topics failed: %s", e)
        report(Sweep(deleted, in_grace))
