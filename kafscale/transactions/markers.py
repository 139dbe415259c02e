"""Ending a prepared transaction everywhere: a marker in every partition, the offsets in every group.

Once PrepareCommit or PrepareAbort is durable the outcome is decided, so each step is retried until it is done
(a partition's owner may be moving, a group's coordinator restarting): nothing is given up while the coordinator
runs. Only a sign that another coordinator incarnation has taken the transactional id over stops the work (that
one re-sends everything, with a higher coordinator epoch; the partitions do not check that epoch: a late marker
from this one can only repeat the outcome the prepared record decided, and ends nothing a second time).
Both steps may be repeated after a crash: a partition ignores a second marker for a transaction it has ended,
a group has nothing pending for a transaction it has completed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kafscale.protocol.errors import ErrorCode
from kafscale.storage.backoff import Backoff
from kafscale.storage.control import TxnMarker
from kafscale.transactions.state import TxnMetadata

log = logging.getLogger(__name__)

WriteMarker = Callable[[str, int, TxnMarker, int], Awaitable[int]]  # (topic, partition, marker, timeout) → code
CompleteOffsets = Callable[[str, int, int, bool], Awaitable[int]]  # (group, producer id, epoch, commit) → code
TopicLookup = Callable[[str], Awaitable[Any]]  # a topic's TopicInfo (partitions), None once it is deleted

# The partition refuses the marker's producer or coordinator epoch: it has seen a newer one. Either another
# coordinator incarnation is ending the transaction (stop), or this one already did (the marker is there).
_FENCED = frozenset({ErrorCode.transaction_coordinator_fenced, ErrorCode.invalid_producer_epoch,
                     ErrorCode.producer_fenced})
# The group's coordinator is elsewhere or starting: ask again.
_GROUP_RETRIABLE = frozenset({ErrorCode.not_coordinator, ErrorCode.coordinator_not_available,
                              ErrorCode.coordinator_load_in_progress, ErrorCode.request_timed_out,
                              ErrorCode.unknown_server_error})


@dataclass(frozen=True, slots=True)
class Completion:
    """What ending one transaction needs from the broker (callbacks: the transactions package sits below it)."""

    write_marker: WriteMarker
    complete_offsets: CompleteOffsets
    topic: TopicLookup | None  # None: a partition is never taken for deleted
    still_ours: Callable[[], Awaitable[bool]]  # has no other incarnation written the transaction since?
    marker_timeout_ms: int = 30_000
    backoff_first_s: float = 0.05
    backoff_cap_s: float = 2.0


async def end_everywhere(prepared: TxnMetadata, how: Completion) -> bool:
    """Markers into every partition and the offsets of every group, in parallel, each until done. False when
    another incarnation took over (the caller must not complete the transaction)."""
    commit = prepared.state.value == "PrepareCommit"
    marker = TxnMarker(prepared.producer_id, prepared.producer_epoch, prepared.coordinator_epoch, commit)
    jobs = [_marker(topic, partition, marker, how) for topic, partition in sorted(prepared.partitions)]
    jobs += [_offsets(group, prepared, commit, how) for group in sorted(prepared.groups)]
    results = await asyncio.gather(*jobs)
    return all(results)


async def _marker(topic: str, partition: int, marker: TxnMarker, how: Completion) -> bool:
    backoff = Backoff(how.backoff_first_s, how.backoff_cap_s)
    attempts = 0
    while True:
        attempts += 1
        try:
            code = ErrorCode(await how.write_marker(topic, partition, marker, how.marker_timeout_ms))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a Ray hop that failed, a shard that died: the marker goes again
            log.warning("marker for %s-%d (producer %d) failed, retrying: %s", topic, partition,
                        marker.producer_id, e)
            await backoff.wait()
            continue
        if code == ErrorCode.none:
            return True
        if code in _FENCED:
            if not await how.still_ours():
                return False
            # This incarnation is current, so the partition's newer epoch is this transaction's own marker
            # (written before a crash) or a later fence of the same producer: the transaction is over there.
            log.warning("marker for %s-%d (producer %d epoch %d) refused with %s; taking it as written", topic,
                        partition, marker.producer_id, marker.producer_epoch, code.name)
            return True
        if code == ErrorCode.unknown_topic_or_partition and await _gone(topic, partition, how):
            log.info("marker for %s-%d skipped: the partition no longer exists", topic, partition)
            return True
        if attempts in (1, 10) or attempts % 100 == 0:
            log.warning("marker for %s-%d (producer %d) answered %s (attempt %d), retrying", topic, partition,
                        marker.producer_id, code.name, attempts)
        await backoff.wait()


async def _gone(topic: str, partition: int, how: Completion) -> bool:
    if how.topic is None:
        return False
    try:
        info = await how.topic(topic)
    except Exception:
        return False
    return info is None or partition >= int(info.partitions)


async def _offsets(group: str, prepared: TxnMetadata, commit: bool, how: Completion) -> bool:
    backoff = Backoff(how.backoff_first_s, how.backoff_cap_s)
    while True:
        try:
            code = ErrorCode(await how.complete_offsets(group, prepared.producer_id, prepared.producer_epoch,
                                                        commit))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning("offsets of group %s for producer %d not completed, retrying: %s", group,
                        prepared.producer_id, e)
            await backoff.wait()
            continue
        if code == ErrorCode.none:
            return True
        if code not in _GROUP_RETRIABLE:
            # Nothing the group can do later either (the group is gone, or holds nothing of this producer).
            log.warning("offsets of group %s for producer %d: %s; going on", group, prepared.producer_id,
                        code.name)
            return True
        await backoff.wait()
