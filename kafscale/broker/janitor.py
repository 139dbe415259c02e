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
- **A pack** (kafscale.storage.pack: what a topic with virtual partitions stores, and what a plain topic's
  partitions on one shard flush together) holds segments of several lanes, each of which commits and drops its
  segments on its own. When it is garbage for good is kafscale.broker.pack_reaping's rule; retention deletes the
  packs it empties at once, and the janitor looks at the rest: a physical partition's packs once per physical
  partition, a plain topic's `packs/` by the shard leading its partition 0, only packs no committed record
  names, and only those older than `grace_s`.
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

from kafscale.broker.pack_reaping import pack_is_dead
from kafscale.cluster import keys
from kafscale.storage import keys as object_keys
from kafscale.storage.async_store import AsyncObjectStore
from kafscale.storage.metadata_store import Compare, Delete, MetadataStore

if TYPE_CHECKING:
    from kafscale.broker.partition_owner import PartitionOwner

log = logging.getLogger(__name__)
TOMBSTONE_AGE_S = 60.0  # a deleted topic's record older than this: its deletion was cut short
DELETE_BATCH = 1000
RANGES_AT_ONCE = 64  # metadata reads in flight while a sweep gathers the pack names a topic's commits hold


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


async def sweep_packs(meta: MetadataStore, objects: AsyncObjectStore, namespace: str, topic: str,
                      physical: int | None, lanes: list[int], grace_s: float, now: float | None = None) -> Sweep:
    """Delete the packs of one physical partition (its virtual partitions `lanes`), or of a plain topic (physical
    None, its partitions `lanes`), that are garbage for good."""
    prefix = (object_keys.packs_prefix(namespace, topic) if physical is None
              else object_keys.partition_prefix(namespace, topic, physical))
    listed = [(o, name) for o in await objects.list(prefix)
              if (name := object_keys.pack_name_of(o.key, namespace, topic)) is not None]
    if not listed:
        return Sweep(0, 0)
    named: set[str] = set()
    for i in range(0, len(lanes), RANGES_AT_ONCE):
        for records in await asyncio.gather(*(meta.range(keys.segments(topic, lane))
                                              for lane in lanes[i:i + RANGES_AT_ONCE])):
            named.update(kv.value.get("pack") for kv in records)
    now = time.time() if now is None else now
    unnamed = [(o, name) for o, name in listed if name not in named]
    due = [(o, name) for o, name in unnamed if now - o.modified >= grace_s]
    dead = []
    for o, name in due:
        try:
            if await pack_is_dead(meta, objects, topic, o.key, o.size, name):
                dead.append(o.key)
        except Exception as e:  # one unreadable pack (damaged, or deleted meanwhile) must not stop the others
            log.warning("janitor: pack %s left alone: %s", o.key, e)
    if dead:
        await objects.delete_many(dead)
        log.info("%s (%s): janitor deleted %d pack(s) no commit names", topic,
                 "packs" if physical is None else f"physical partition {physical}", len(dead))
    return Sweep(len(dead), len(unnamed) - len(dead))


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
              report: Callable[[Sweep], None], partitions: Callable[[str], int] = lambda _t: 0) -> None:
    """One loop per shard over the partitions it owns; the shard for which leads() is true also finishes
    topic deletions (any shard may, and two at once are harmless: the lowest live shard id does). A virtual
    topic's packs are swept by physical partition, a plain topic's `packs/` by the shard leading its partition 0
    (whether or not this broker packs: an earlier run may have); partitions(topic): its partition count now."""
    while True:
        await asyncio.sleep(interval_s)
        deleted = in_grace = 0
        physical: dict[tuple[str, int | None], list[int]] = {}  # (topic, physical partition or None): lanes
        for owner in list(owners()):
            if owner.closed or owner.fenced:
                continue
            if owner.packer is not None and owner.packer.physical is not None:
                physical.setdefault((owner.topic, owner.packer.physical), owner.packer.lanes)
            elif owner.partition == 0:
                physical[(owner.topic, None)] = list(range(partitions(owner.topic)))
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
                log.warning("janitor: packs of %s (%s) failed: %s", topic, "packs" if unit is None else unit, e)
        if leads():
            try:
                deleted += (await sweep_deleted_topics(meta, objects, namespace)).deleted
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("janitor: deleted topics failed: %s", e)
        report(Sweep(deleted, in_grace))
