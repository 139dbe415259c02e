"""A transactional producer's Produce: batches that would open a transaction in a partition are checked with the
transaction's coordinator first (KIP-890 part 1), as Kafka does since 3.6. With Produce v12+ (transactions v2,
KIP-890 part 2) the coordinator adds the partition to the transaction instead: the producer sends no
AddPartitionsToTxn, and since its epoch bumps with every transaction, the first batch of each transaction in each
partition takes this path.

Without the check, a batch from a fenced producer, or for a partition its transaction never added, would open a
transaction that no coordinator will ever end: the partition's last stable offset would stay behind it and hold
every read_committed consumer. The check costs one call to the coordinator per partition and transaction: a
partition where the producer's transaction is already open here appends at once, on the usual path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from kio.schema.errors import ErrorCode

from kafscale.broker.interface import ProduceItem
from kafscale.broker.results import ProduceResult
from kafscale.storage.batch import InvalidBatchError, read_header

if TYPE_CHECKING:
    from kafscale.broker.shard import ShardCore

T = TypeVar("T")

# What a produce answers when the coordinator could not say: retriable, as Kafka maps these.
_RETRY = {ErrorCode.not_coordinator, ErrorCode.coordinator_not_available, ErrorCode.coordinator_load_in_progress,
          ErrorCode.concurrent_transactions, ErrorCode.request_timed_out}
# Adding (v12+): the previous transaction's markers may still be going out. Kafka's leader retries that a moment
# (add.partitions.to.txn.retry.backoff.ms and .max.ms), then answers CONCURRENT_TRANSACTIONS, which v12 producers
# retry.
ADD_RETRY_BACKOFF_S, ADD_RETRY_MAX_S = 0.02, 0.1


def start(core: ShardCore, transactional_id: str, items: list[ProduceItem], acks: int, timeout_ms: int,
          then: Callable[[list[ProduceResult]], T], add: bool = False) -> asyncio.Future[T]:
    unchecked: list[int] = []
    producer: tuple[int, int] | None = None
    for i, (topic, partition, records) in enumerate(items):
        try:
            header = read_header(records, 0)
        except InvalidBatchError:
            continue  # the owner refuses it with the right code
        if not header.is_transactional or header.producer_id < 0:
            continue
        producer = (header.producer_id, header.producer_epoch)
        owner = core._ready_owner(topic, partition)
        if owner is not None and owner.txns.open.get(header.producer_id) is not None \
                and owner.producer_epoch(header.producer_id) == header.producer_epoch:
            continue  # its transaction is open here: this batch joins it
        unchecked.append(i)
    if not unchecked or producer is None:
        return core.producer.start(items, acks, timeout_ms, then)
    return asyncio.get_running_loop().create_task(
        _checked(core, transactional_id, producer, unchecked, items, acks, timeout_ms, then, add))


async def _checked(core: ShardCore, transactional_id: str, producer: tuple[int, int], unchecked: list[int],
                   items: list[ProduceItem], acks: int, timeout_ms: int,
                   then: Callable[[list[ProduceResult]], T], add: bool) -> T:
    parts = [(items[i][0], items[i][1]) for i in unchecked]
    codes = await _ask(core, transactional_id, producer, parts, add)
    refused = {i: _produce_error(ErrorCode(code), add) for i, code in zip(unchecked, codes, strict=True) if code}
    passed = [item for i, item in enumerate(items) if i not in refused]
    results = await core.producer.start(passed, acks, timeout_ms, lambda rs: rs)
    done = iter(results)
    return then([refused[i] if i in refused else next(done) for i in range(len(items))])


async def _ask(core: ShardCore, transactional_id: str, producer: tuple[int, int], parts: list[tuple[str, int]],
               add: bool) -> list[int]:
    deadline = asyncio.get_running_loop().time() + ADD_RETRY_MAX_S
    while True:
        try:
            codes = await core.verify_txn(transactional_id, producer[0], producer[1], parts, add=add)
        except Exception:  # the coordinator's shard is going away: the producer retries
            return [int(ErrorCode.coordinator_not_available)] * len(parts)
        busy = any(code == ErrorCode.concurrent_transactions for code in codes)
        if not (add and busy) or asyncio.get_running_loop().time() + ADD_RETRY_BACKOFF_S > deadline:
            return codes
        await asyncio.sleep(ADD_RETRY_BACKOFF_S)


def _produce_error(code: ErrorCode, add: bool) -> ProduceResult:
    """A refused check as a Produce answer: a fenced producer gets INVALID_PRODUCER_EPOCH (what Kafka's Produce
    answers), a partition outside the transaction INVALID_TXN_STATE, and a coordinator that could not answer a
    retriable NOT_ENOUGH_REPLICAS; v12+ (add) gets CONCURRENT_TRANSACTIONS as it is, which it retries."""
    if code == ErrorCode.concurrent_transactions and add:
        return ProduceResult(int(code))
    if code in _RETRY:
        return ProduceResult(int(ErrorCode.not_enough_replicas), message=f"transaction check: {code.name}")
    if code == ErrorCode.producer_fenced:
        return ProduceResult(int(ErrorCode.invalid_producer_epoch))
    return ProduceResult(int(code))
