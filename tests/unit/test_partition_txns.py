"""The partition side of transactions, on a PartitionOwner over real local stores: transactional batches open a
transaction, markers end it, the last stable offset follows, aborted ranges are indexed with their segment, and
all of it survives a new owner (a move or a restart)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiokafka.record.default_records import DefaultRecordBatchBuilder
from kio.schema.errors import ErrorCode

from kafscale.broker.fetch import READ_COMMITTED, read_one
from kafscale.broker.partition_owner import PartitionOwner
from kafscale.broker.stats import NO_METRICS
from kafscale.cluster import keys
from kafscale.cluster.records import AbortedTxn, SegmentMeta
from kafscale.storage.batch import split_batches
from kafscale.storage.control import TxnMarker, marker_of
from tests.unit.test_partition_owner import Env, batch, durable, eventually, values

PID, OTHER = 1000, 2000


def txn_batch(vals: Sequence[bytes], *, pid: int = PID, epoch: int = 0, seq: int = 0) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=1, producer_id=pid,
                                        producer_epoch=epoch, base_sequence=seq, batch_size=1 << 30)
    for i, value in enumerate(vals):
        assert builder.append(i, timestamp=1_000, key=None, value=value, headers=[]) is not None
    return bytes(builder.build())


async def mark(owner: PartitionOwner, commit: bool, pid: int = PID, epoch: int = 0) -> int:
    outcome = owner.append_marker(TxnMarker(pid, epoch, 3, commit))
    await durable(outcome)
    return outcome.base_offset


async def committed_read(owner: PartitionOwner, offset: int) -> tuple[list[int], list[tuple[int, int]], int]:
    """(base offsets of the batches, aborted list, last stable offset) of read_committed fetches from offset on,
    as a consumer makes them (one segment each) until one answers nothing."""
    bases: list[int] = []
    aborted: list[tuple[int, int]] = []
    while True:
        r = await read_one(owner, offset, 1 << 20, NO_METRICS, READ_COMMITTED)
        assert r.error == 0, r
        assert r.aborted is not None
        found = [h for _, h in split_batches(r.records)]
        aborted += [a for a in r.aborted if a not in aborted]
        if not found:
            return bases, aborted, r.last_stable_offset
        bases += [h.base_offset for h in found]
        offset = found[-1].last_offset + 1


async def test_an_open_transaction_holds_the_last_stable_offset_until_its_commit_marker_is_durable(env: Env) -> None:
    owner = await env.owner()
    await durable(await owner.append(batch(values(2)), acks=-1))  # offsets 0-1, not transactional
    await durable(await owner.append(txn_batch(values(3)), acks=-1))  # 2-4
    assert (owner.high_watermark, owner.last_stable_offset) == (5, 2)
    assert await committed_read(owner, 0) == ([0], [], 2)
    assert await committed_read(owner, 2) == ([], [], 2)  # at the LSO: nothing yet, no error
    uncommitted = await read_one(owner, 2, 1 << 20, NO_METRICS)
    assert [h.base_offset for _, h in split_batches(uncommitted.records)] == [2]
    assert uncommitted.aborted is None

    marker_at = await mark(owner, commit=True)
    assert marker_at == 5
    assert (owner.high_watermark, owner.last_stable_offset) == (6, 6)
    assert await committed_read(owner, 2) == ([2, 5], [], 6)
    data = (await read_one(owner, 5, 1 << 20, NO_METRICS, READ_COMMITTED)).records
    [(pos, header)] = split_batches(data)
    assert header.is_control and header.is_transactional
    assert marker_of(data, pos, header) == TxnMarker(PID, 0, 3, True)


async def test_an_aborted_range_is_listed_to_read_committed_readers_and_kept_with_its_segment(env: Env) -> None:
    owner = await env.owner()
    await durable(await owner.append(txn_batch(values(2), pid=OTHER), acks=-1))  # 0-1: OTHER's, committed later
    await durable(await owner.append(txn_batch(values(3)), acks=-1))  # 2-4: aborted
    aborted_at = await mark(owner, commit=False)  # 5
    assert owner.last_stable_offset == 0  # OTHER's transaction is still open
    await mark(owner, commit=True, pid=OTHER)  # 6
    assert owner.last_stable_offset == 7 == owner.high_watermark
    bases, aborted, _ = await committed_read(owner, 0)
    assert bases == [0, 2, 5, 6] and aborted == [(PID, 2)]
    assert (await committed_read(owner, 6))[1] == []  # a read after the abort marker overlaps nothing

    stored = [SegmentMeta.from_value(kv.value) for kv in await env.meta.range(keys.segments("orders", 0))]
    assert [a for s in stored for a in s.aborted] == [AbortedTxn(PID, 2, aborted_at)]


async def test_a_new_owner_keeps_open_transactions_and_the_aborted_index(env: Env) -> None:
    first = await env.owner()
    await durable(await first.append(txn_batch(values(2)), acks=-1))  # 0-1, aborted below
    await mark(first, commit=False)  # 2
    await durable(await first.append(txn_batch(values(2), pid=OTHER), acks=-1))  # 3-4, left open
    await first.close()

    second = await env.owner()
    assert (second.high_watermark, second.last_stable_offset) == (5, 3)
    assert (await committed_read(second, 0))[:2] == ([0, 2], [(PID, 0)])
    await mark(second, commit=True, pid=OTHER)
    assert second.last_stable_offset == 6


async def test_a_marker_with_a_newer_epoch_fences_the_producer(env: Env) -> None:
    owner = await env.owner()
    await durable(await owner.append(txn_batch(values(1), epoch=4), acks=-1))
    stale = owner.append_marker(TxnMarker(PID, 3, 0, False))
    assert stale.error == ErrorCode.invalid_producer_epoch
    await mark(owner, commit=False, epoch=5)  # the coordinator aborted it and bumped the epoch
    late = await owner.append(txn_batch(values(1), epoch=4, seq=1), acks=-1)
    assert late.error == ErrorCode.invalid_producer_epoch
    await durable(await owner.append(txn_batch(values(1), epoch=6, seq=0), acks=-1))  # the next incarnation


async def test_control_batches_from_a_client_are_refused(env: Env) -> None:
    owner = await env.owner()
    outcome = await owner.append(bytes(TxnMarker(PID, 0, 0, True).batch(1_000)), acks=-1)
    assert outcome.error == ErrorCode.invalid_record
    assert owner.next_offset == 0


async def test_a_retried_marker_for_no_open_transaction_ends_nothing(env: Env) -> None:
    owner = await env.owner()
    await durable(await owner.append(txn_batch(values(1)), acks=-1))
    await mark(owner, commit=False)
    await mark(owner, commit=False)  # the coordinator's retry after a crash
    _, aborted, lso = await committed_read(owner, 0)
    assert aborted == [(PID, 0)] and lso == 3
    await asyncio.sleep(0)
    await eventually(lambda: owner.high_watermark == 3, "both markers committed")
