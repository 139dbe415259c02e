"""The local half of Fetch: one long poll over the requested partitions this shard owns.

It reads what is available and, while that is less than min_bytes, waits (up to max_wait) on one event that
every involved owner sets after a commit. max_bytes is shared by the partitions, in request order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from kio.schema.errors import ErrorCode

from kafscale.broker.interface import FetchItem
from kafscale.broker.partition_owner import PartitionOwner
from kafscale.broker.results import FetchResult
from kafscale.broker.stats import BrokerMetrics
from kafscale.storage.batch import split_batches
from kafscale.storage.health import HealthState

log = logging.getLogger(__name__)

READ_COMMITTED = 1  # Fetch's and ListOffsets' isolation_level


async def long_poll(owners: dict[int, PartitionOwner], parts: list[FetchItem], max_wait_ms: int, min_bytes: int,
                    max_bytes: int, metrics: BrokerMetrics, isolation_level: int = 0) -> dict[int, FetchResult]:
    """{index into parts: result} for the partitions in owners (keyed by their index in parts)."""
    results: dict[int, FetchResult] = {}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_wait_ms / 1000
    event = asyncio.Event()
    for o in owners.values():
        o.add_data_waiter(event)
    try:
        while True:
            event.clear()
            budget = max_bytes
            total = 0
            for i, o in owners.items():
                # Most partitions of a consumer's fetch have nothing new: answered without a coroutine.
                r = results[i] = read_now(o, parts[i][2], isolation_level) or await read_one(
                    o, parts[i][2], min(parts[i][3], max(budget, 1)), metrics, isolation_level)
                total += len(r.records)
                budget -= len(r.records)
            now = loop.time()
            if total >= min_bytes or now >= deadline or not owners or any(r.error for r in results.values()):
                return results
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout=deadline - now)
    finally:
        for o in owners.values():
            o.remove_data_waiter(event)


def read_now(owner: PartitionOwner, offset: int, isolation_level: int) -> FetchResult | None:
    """The answer when there is nothing to read (an error, or nothing new at `offset`); None when there is."""
    hwm, start = owner.high_watermark, owner.log_start_offset
    if owner.fenced or owner.closed:
        return FetchResult(int(ErrorCode.not_leader_or_follower), hwm, start)
    if offset < start or offset > hwm:
        return FetchResult(int(ErrorCode.offset_out_of_range), hwm, start)
    committed = isolation_level == READ_COMMITTED
    if offset == hwm:
        return FetchResult(0, hwm, start, b"", owner.last_stable_offset, [] if committed else None)
    if committed and offset >= (lso := owner.last_stable_offset):
        return FetchResult(0, hwm, start, b"", lso, [])
    return None


async def read_one(owner: PartitionOwner, offset: int, max_bytes: int, metrics: BrokerMetrics,
                   isolation_level: int = 0) -> FetchResult:
    quick = read_now(owner, offset, isolation_level)
    if quick is not None:
        return quick
    hwm, start, lso = owner.high_watermark, owner.log_start_offset, owner.last_stable_offset
    committed = isolation_level == READ_COMMITTED
    if owner.objects.state() != HealthState.HEALTHY and not owner.reader.cached(offset):
        # The seed's health gating: no new reads pile onto a sick object store; the consumer
        # retries. Committed data already in memory is still served: it needs no S3 call.
        return FetchResult(int(ErrorCode.kafka_storage_error), hwm, start)
    try:
        records = await owner.reader.read(offset, max_bytes)
    except Exception as e:
        log.warning("read of %s-%d at %d failed: %s", owner.topic, owner.partition, offset, e)
        return FetchResult(int(ErrorCode.kafka_storage_error), hwm, start)
    aborted = None
    if committed:
        records, aborted = _committed_part(owner, records, offset, lso)
    metrics.fetched(owner.topic, records)
    owner.bytes_out += len(records)
    return FetchResult(0, hwm, start, records, lso, aborted)


def _committed_part(owner: PartitionOwner, records: bytes, offset: int,
                    lso: int) -> tuple[bytes, list[tuple[int, int]]]:
    """What a read_committed consumer gets of `records`: the batches below the last stable offset, and the
    aborted transactions they overlap (the consumer drops those producers' records up to each abort marker).
    Nothing to do, and nothing parsed, on a partition that never saw a transaction."""
    if lso >= owner.high_watermark and not owner.txns.aborted:
        return records, []
    end = 0
    last = offset
    for _, header in split_batches(records, verify_crc=False):
        if header.base_offset >= lso:
            break
        end += header.size
        last = header.last_offset
    return records[:end], [(a.producer_id, a.first_offset) for a in owner.txns.aborted_between(offset, last)]
