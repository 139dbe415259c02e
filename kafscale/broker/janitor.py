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
- **A deleted topic's objects** are deleted only after listing them and then finding the topic still absent: a
  topic of the same name made after that check writes only objects the listing did not contain. The deleted
  topic's record (`deleted_topics/{name}`) is removed once a pass after the grace period finds nothing left.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kafscale.cluster import keys
from kafscale.storage import keys as object_keys
from kafscale.storage.async_store import AsyncObjectStore
from kafscale.storage.metadata_store import Compare, Delete, MetadataStore

if TYPE_CHECKING:
    from kafscale.broker.partition_owner import PartitionOwner

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Sweep:
    deleted: int  # objects deleted
    in_grace: int  # garbage not yet old enough to delete


async def sweep_partition(owner: PartitionOwner, grace_s: float, now: float | None = None) -> Sweep:
    """Delete the owner's partition's objects that are garbage for good and older than grace_s."""
    ns, topic, partition = owner.settings.namespace, owner.topic, owner.partition
    end = owner.high_watermark  # read together with the segments, before the listing (see above)
    committed = {key for s in owner.segments
                 for key in (object_keys.segment_key(ns, topic, partition, s.base, s.key_epoch),
                             object_keys.index_key(ns, topic, partition, s.base, s.key_epoch))}
    listed = await owner.objects.list(object_keys.partition_prefix(ns, topic, partition))
    now = time.time() if now is None else now
    garbage = [o for o in listed if o.key not in committed and _below(o.key, end)]
    due = [o.key for o in garbage if now - o.modified >= grace_s]
    if due:
        await owner.objects.delete_many(due)
        for s in due:
            parsed = object_keys.parse_segment_key(s)
            if parsed is not None:
                owner.reader.cache.discard(("seg" if parsed.kind == "kfs" else "idx", topic, partition,
                                            parsed.base_offset))
        log.info("%s-%d: janitor deleted %d uncommitted object(s) below offset %d", topic, partition, len(due), end)
    return Sweep(len(due), len(garbage) - len(due))


def _below(key: str, end: int) -> bool:
    parsed = object_keys.parse_segment_key(key)
    return parsed is not None and parsed.base_offset < end


async def sweep_deleted_topics(meta: MetadataStore, objects: AsyncObjectStore, namespace: str, grace_s: float,
                               now: float | None = None) -> Sweep:
    """Finish the deletions of deleted topics: their objects go, then (after grace_s) their records."""
    deleted = 0
    for kv in await meta.range(keys.DELETED_TOPICS):
        name = kv.key[len(keys.DELETED_TOPICS):]
        count = await delete_topic_objects(meta, objects, namespace, name)
        deleted += max(count, 0)
        at_s = int(kv.value.get("at_ms", 0)) / 1000
        recreated = count < 0
        if recreated or (count == 0 and (time.time() if now is None else now) - at_s >= grace_s):
            # Recreated: its new owners' sweeps take what the old topic left. Otherwise a pass after the
            # grace found nothing: the last upload a zombie owner could have made is long gone too.
            # Only this record: the topic may have been deleted again since, with a record of its own.
            await meta.txn([Compare(kv.key, "mod_revision", "==", kv.mod_revision)], [Delete(kv.key)])
    return Sweep(deleted, 0)


async def delete_topic_objects(meta: MetadataStore, objects: AsyncObjectStore, namespace: str, name: str) -> int:
    """Delete what is stored under a deleted topic's prefix; -1 (and nothing deleted) if the topic exists."""
    listed = await objects.list(f"{namespace}/{name}/")
    if await meta.get(keys.topic(name)) is not None:
        return -1
    if listed:
        await objects.delete_many([o.key for o in listed])
        log.info("deleted topic %s: %d object(s) removed", name, len(listed))
    return len(listed)


async def run(owners: Callable[[], Iterable[PartitionOwner]], leads: Callable[[], bool], meta: MetadataStore,
              objects: AsyncObjectStore, namespace: str, interval_s: float, grace_s: float,
              report: Callable[[Sweep], None]) -> None:
    """One loop per shard over the partitions it owns; the shard for which leads() is true also finishes
    topic deletions (any shard may, and two at once are harmless: the lowest live shard id does)."""
    while True:
        await asyncio.sleep(interval_s)
        deleted = in_grace = 0
        for owner in list(owners()):
            if owner.closed or owner.fenced:
                continue
            try:
                result = await sweep_partition(owner, grace_s)
                deleted, in_grace = deleted + result.deleted, in_grace + result.in_grace
            except asyncio.CancelledError:
                raise
            except Exception as e:  # store trouble: the next round tries again
                log.warning("janitor: %s-%d failed: %s", owner.topic, owner.partition, e)
        if leads():
            try:
                deleted += (await sweep_deleted_topics(meta, objects, namespace, grace_s)).deleted
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("janitor: deleted topics failed: %s", e)
        report(Sweep(deleted, in_grace))
