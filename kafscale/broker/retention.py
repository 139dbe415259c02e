"""Retention: whole segments past retention.ms or beyond retention.bytes are deleted, and the log start
offset moves past them durably (also what DeleteRecords uses to move it).

Kafka's rules: a segment expires when its newest record is older than retention.ms; by size, the
oldest segments go while the partition would still hold at least retention.bytes without them. Only
a prefix of the log is ever deleted. Order matters for readers: the state commit (new log start,
segment entries removed) comes first, so no fetch is ever pointed at an object that is gone; the
objects are deleted after it. An object whose delete fails is only garbage, never served again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from kafscale.broker.pack_reaping import Local, reap_dropped
from kafscale.broker.partition_owner import FencedError
from kafscale.broker.results import DeleteRecordsResult
from kafscale.cluster import topic_configs
from kafscale.cluster.records import SegmentMeta
from kafscale.storage import keys as object_keys

if TYPE_CHECKING:
    from kafscale.broker.partition_owner import PartitionOwner

log = logging.getLogger(__name__)


def retention_start(segments: list[SegmentMeta], log_start: int, retention_ms: int, retention_bytes: int,
                    now_ms: int) -> int:
    """The log start offset the retention settings ask for (log_start when nothing expires)."""
    live = [s for s in segments if s.last >= log_start]
    by_time = 0
    if retention_ms >= 0:
        for s in live:
            newest = s.max_ts if s.max_ts >= 0 else s.created_ms
            if newest >= now_ms - retention_ms:
                break
            by_time += 1
    by_size = 0
    if retention_bytes >= 0:
        excess = sum(s.size for s in live) - retention_bytes
        for s in live:
            if excess - s.size < 0:
                break
            excess -= s.size
            by_size += 1
    count = max(by_time, by_size)
    return max(log_start, live[count - 1].last + 1) if count else log_start


def _keys(s: SegmentMeta, ns: str, topic: str, partition: int) -> set[str]:
    """The committed segment's objects, and the plain keys a dead owner may have left at its base."""
    at = s.stored(ns, topic, partition)
    return {at.key, at.index_key, object_keys.segment_key(ns, topic, partition, s.base),
            object_keys.index_key(ns, topic, partition, s.base)}


async def truncate(owner: PartitionOwner, offset: int, local: Local) -> int:
    """Move owner's log start to offset and delete the segments wholly below it; the new log start. local: the
    shard's open owners, which tell whether a pack the segments were in is still needed."""
    dropped = await owner.advance_log_start(offset)
    if dropped:
        ns, topic, partition = owner.settings.namespace, owner.topic, owner.partition
        # The plain keys always, and the epoch keys where the commit names them: the plain key then
        # holds a dead owner's uncommitted leftover, garbage that goes with the range it covered.
        # A packed segment's pack holds other lanes' segments too: it goes once no lane needs it.
        gone = [key for s in dropped if not s.pack for key in _keys(s, ns, topic, partition)]
        for s in dropped:
            owner.reader.discard(s)
        try:
            if gone:
                await owner.objects.delete_many(gone)
            packs = await reap_dropped(owner, dropped, local)
        except Exception as e:
            log.warning("%s-%d: log start moved to %d but deleting %d objects failed: %s", topic, partition,
                        owner.log_start_offset, len(gone), e)
        else:
            log.info("%s-%d: log start %d, %d segments deleted (%d packs)", topic, partition, owner.log_start_offset,
                     len(dropped), packs)
    return owner.log_start_offset


async def enforce(owner: PartitionOwner, local: Local, now_ms: int | None = None) -> int:
    """Apply the topic's retention to one owner (local: the shard's open owners); returns the log start offset
    afterwards."""
    configs = owner.topic_config()
    if "delete" not in topic_configs.policies(configs):
        return owner.log_start_offset  # compact only (or no policy): nothing expires, as in Kafka
    start = retention_start(owner.segments, owner.log_start_offset, int(configs.get("retention.ms", 604800000)),
                            int(configs.get("retention.bytes", -1)),
                            int(time.time() * 1000) if now_ms is None else now_ms)
    if start > owner.log_start_offset:
        return await truncate(owner, start, local)
    return owner.log_start_offset


async def run(owners: Callable[[], Local], interval_s: float) -> None:
    """One loop per shard, over every owner it hosts (one timer, not one per partition)."""
    while True:
        await asyncio.sleep(interval_s)
        local = owners()
        for owner in list(local.values()):
            if owner.closed or owner.fenced:
                continue
            try:
                await enforce(owner, local)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # store trouble, or the owner was fenced: the next round tries again
                log.warning("retention of %s-%d failed: %s", owner.topic, owner.partition, e)


async def delete_records(owner: PartitionOwner, offset: int, local: Local) -> DeleteRecordsResult:
    """DeleteRecords for one partition, on the shard that owns it: the log start moves to offset (-1: the
    high watermark)."""
    target = owner.high_watermark if offset == -1 else offset
    if not 0 <= target <= owner.high_watermark:
        return DeleteRecordsResult(int(ErrorCode.offset_out_of_range))
    try:
        return DeleteRecordsResult(0, await truncate(owner, target, local))
    except FencedError:
        return DeleteRecordsResult(int(ErrorCode.not_leader_or_follower))
    except Exception as e:  # metadata store trouble: retriable
        log.warning("DeleteRecords on %s-%d failed: %s", owner.topic, owner.partition, e)
        return DeleteRecordsResult(int(ErrorCode.request_timed_out))
