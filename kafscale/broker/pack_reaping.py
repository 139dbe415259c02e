"""When a pack is garbage for good, and deleting the packs retention empties as soon as it does.

A pack (kafscale.storage.pack) holds segments of several lanes: a virtual topic's lanes, or the partitions of a
plain topic that one shard flushed together. Each lane commits its segments on its own and drops them on its
own, so no single commit frees a pack. It is garbage for good when, for every lane its trailer lists, the lane's
record at the segment's base does not name the pack, and either the lane's committed end is past that base
(commits only add at the end) or the lane's owner epoch is past the one that wrote the segment (that writer's
commits are fenced). The reads go epoch, then end, then record: a commit writes the end and the record at once,
under the epoch it was made with, so what a fenced writer committed before losing the lane is seen. A lane whose
owner is open on this shard is judged from that owner instead: what it holds is what it committed, and a stale
view (an owner fenced without knowing it yet) can only keep a pack alive, never free one that is named.

The janitor applies this rule to packs no commit names (kafscale.broker.janitor), once they are older than its
grace. Retention applies it at once to the packs whose segments it drops, as it deletes a plain segment's objects
at once, and only to packs whose every segment retention dropped (below its lane's log start): one a compaction
replaced may still be read by a fetch that looked it up just before the swap, and waits for the janitor. A pack
that a lane open on this shard still names is skipped without a request (that lane's own pass comes to it), any
other is read and deleted if dead. Normally the last lane to drop a pack frees it, for one HEAD, one trailer read
and one delete.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from kafscale.broker.packed import read_trailer
from kafscale.cluster import keys
from kafscale.cluster.records import SegmentMeta
from kafscale.storage import keys as object_keys
from kafscale.storage.async_store import AsyncObjectStore
from kafscale.storage.metadata_store import MetadataStore

if TYPE_CHECKING:
    from kafscale.broker.partition_owner import PartitionOwner

log = logging.getLogger(__name__)

Local = Mapping[tuple[str, int], "PartitionOwner"]  # this shard's open owners, by (topic, partition)
# How far into another lane's segments a pass looks for the packs it dropped: they were flushed in the same
# ticks, so they sit at the front. Looking no further only costs a read when a reference is deeper.
SCAN_SLACK = 16


async def pack_is_dead(meta: MetadataStore, objects: AsyncObjectStore, topic: str, key: str, size: int, name: str,
                       local: Local | None = None, dropped_only: bool = False) -> bool:
    """Whether the pack `name` (at `key`, `size` bytes) is garbage for good, by the rule above. dropped_only (what
    retention asks): whether every lane's segment in it is also below the lane's log start, dropped by retention;
    a segment a compaction replaced may still be read by a fetch that looked it up before the swap, so such a pack
    waits for the janitor and its grace."""
    for lane in (await read_trailer(objects, key, size)).lanes:
        owner = local.get((topic, lane.lane)) if local is not None else None
        if owner is not None and not owner.closed and not owner.fenced:
            named = _names(owner.segments, lane.base, name)
            end, start, fenced = owner.high_watermark, owner.log_start_offset, owner.epoch > lane.epoch
        else:
            owner_kv = await meta.get(keys.owner(topic, lane.lane))
            state = await meta.get(keys.state(topic, lane.lane))
            record = await meta.get(keys.segment(topic, lane.lane, lane.base))
            named = record is not None and record.value.get("pack") == name
            end = int(state.value["next_offset"]) if state is not None else 0
            start = int(state.value.get("log_start_offset", 0)) if state is not None else 0
            fenced = owner_kv is not None and int(owner_kv.value.get("epoch", 0)) > lane.epoch
        if named or (lane.base >= end and not fenced):
            return False  # still read, or its commit may still be on its way
        if dropped_only and lane.base >= start:
            return False  # replaced (a compaction) or never committed, not dropped: the janitor's, after its grace
    return True


async def reap_dropped(owner: PartitionOwner, dropped: Iterable[SegmentMeta], local: Local) -> int:
    """Delete the packs of `dropped` (segments retention just dropped from `owner`) that no lane needs any more;
    returns how many went."""
    dropped = list(dropped)
    names = {s.pack for s in dropped if s.pack}
    if not names:
        return 0
    for (topic, _), other in list(local.items()):
        if topic == owner.topic and other is not owner:
            names.difference_update(s.pack for s in other.segments[:len(dropped) + SCAN_SLACK])
    ns = owner.settings.namespace
    dead: list[str] = []
    for name in sorted(names):
        key = object_keys.pack_key(ns, owner.topic, name)
        try:
            info = await owner.objects.head(key)
            if info is not None and await pack_is_dead(owner.meta, owner.objects, owner.topic, key, info.size, name,
                                                       local, dropped_only=True):
                dead.append(key)
        except Exception as e:  # the janitor judges it later
            log.warning("%s-%d: pack %s left to the janitor: %s", owner.topic, owner.partition, name, e)
    if dead:
        await owner.objects.delete_many(dead)
    return len(dead)


def _names(segments: list[SegmentMeta], base: int, name: str) -> bool:
    """Whether the owner's committed segment at `base` is the one in pack `name` (segments are in offset order)."""
    i = bisect.bisect_left(segments, base, key=lambda s: s.base)
    return i < len(segments) and segments[i].base == base and segments[i].pack == name
