"""The produce path of one shard: the fast path, the per-partition queue that keeps arrival order, and the
acks=all wait.

A partition whose owner is open, has buffer room and has no earlier request still queued is appended at once
(`try_produce`): in the steady state no task runs for a request, and its answer is a future the owners'
durability callbacks complete (kafscale.broker.produce_wait). Any other partition queues behind its FIFO lock
while its owner opens or its buffer is full, or goes to the shard that leads it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from kio.schema.errors import ErrorCode

from kafscale.broker.interface import ProduceItem
from kafscale.broker.partition_owner import AppendOutcome, PartitionOwner
from kafscale.broker.produce_wait import DurableWait, wait_durable
from kafscale.broker.results import ProduceResult
from kafscale.broker.routing import Refused, Remote, Route

T = TypeVar("T")
Appended = tuple[ProduceResult, "asyncio.Future[None] | None"]  # the answer, and the future of its durability


class ProducePath:
    def __init__(self, ready: Callable[[str, int], PartitionOwner | None],
                 route: Callable[[str, int, float | None], Awaitable[Route]]) -> None:
        self._ready = ready  # the open owner of a partition led here, or None
        self._route = route  # ShardCore.route
        self._append_locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._queued: dict[tuple[str, int], int] = {}  # produce() calls not yet past their append

    def start(self, items: list[ProduceItem], acks: int, timeout_ms: int,
              then: Callable[[list[ProduceResult]], T]) -> asyncio.Future[T]:
        """One Produce request's partitions: a future of then(results), results in request order. Each
        partition takes the fast path (try_produce) where it can and queues behind the partition's lock
        otherwise. When every partition took the fast path (the steady state) no task runs: the future
        completes from the owners' durability callbacks (acks=all) or at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_ms, 1) / 1000
        results: list[ProduceResult] = [_NOT_YET] * len(items)
        durable: dict[asyncio.Future[None], ProduceResult] = {}
        queued: dict[int, asyncio.Task[Appended]] = {}
        try:
            for i, (topic, partition, records) in enumerate(items):
                hit = self.try_produce(topic, partition, records, acks)
                if hit is None:
                    queued[i] = self._queue_append(topic, partition, records, acks, deadline)
                    continue
                results[i], fut = hit
                if fut is not None and acks == -1 and results[i].error == 0:
                    durable[fut] = results[i]
        except BaseException:
            for task in queued.values():
                task.cancel()
            raise
        if queued:
            return loop.create_task(self._produce_rest(queued, results, durable, acks, deadline, then))
        if durable:
            return DurableWait(loop, durable, deadline, lambda: then(results)).future
        done: asyncio.Future[T] = loop.create_future()
        done.set_result(then(results))
        return done

    async def _produce_rest(self, queued: dict[int, asyncio.Task[Appended]], results: list[ProduceResult],
                            durable: dict[asyncio.Future[None], ProduceResult], acks: int, deadline: float,
                            then: Callable[[list[ProduceResult]], T]) -> T:
        appended = await asyncio.gather(*queued.values())
        for i, (result, fut) in zip(queued, appended, strict=True):
            results[i] = result
            if fut is not None and acks == -1 and result.error == 0:
                durable[fut] = result
        await wait_durable(durable, deadline)
        return then(results)

    def try_produce(self, topic: str, partition: int, records: bytes | bytearray, acks: int) -> Appended | None:
        """The produce path without a wait, for a partition that is local and open, has buffer room
        and has no earlier request still queued in produce(). None: nothing done, use produce()."""
        if (topic, partition) in self._queued:
            return None
        owner = self._ready(topic, partition)
        if owner is None:
            return None
        outcome = owner.try_append(records, acks=acks)
        if outcome is None:
            return None
        return _produce_result(outcome), outcome.durable

    async def produce(self, topic: str, partition: int, records: bytes | bytearray, acks: int,
                      timeout_ms: int) -> ProduceResult:
        """One partition's records through the queue (also the call other shards forward)."""
        # The request timeout bounds the whole request: queueing, opening the owner, back-pressure
        # and the wait for durability, so that a sick store gets a retriable answer in time.
        deadline = asyncio.get_running_loop().time() + max(timeout_ms, 1) / 1000
        result, durable = await self._queue_append(topic, partition, records, acks, deadline)
        if durable is not None and acks == -1 and result.error == 0:
            await wait_durable({durable: result}, deadline)
        return result

    def _queue_append(self, topic: str, partition: int, records: bytes | bytearray, acks: int,
                      deadline: float) -> asyncio.Task[Appended]:
        """Mark the partition queued now, so that no later request takes the fast path past this one, and
        append behind its lock in a task. The mark goes when the task ends, however it ends: also when it
        is cancelled before its first step (its connection went away)."""
        key = (topic, partition)
        self._queued[key] = self._queued.get(key, 0) + 1
        task = asyncio.get_running_loop().create_task(self._append_in_order(topic, partition, records, acks,
                                                                            deadline))
        task.add_done_callback(lambda _: self._leave_queue(key))
        return task

    def _leave_queue(self, key: tuple[str, int]) -> None:
        if self._queued[key] == 1:
            del self._queued[key]
        else:
            self._queued[key] -= 1

    async def _append_in_order(self, topic: str, partition: int, records: bytes | bytearray, acks: int,
                               deadline: float) -> Appended:
        # Offsets must follow arrival order. asyncio.Lock is FIFO, so holding it from arrival until
        # the owner has assigned offsets keeps a request that came later (e.g. while the owner was
        # still opening) from overtaking an earlier one; _queued keeps try_produce from doing so.
        key = (topic, partition)
        lock = self._append_locks.get(key)
        if lock is None:
            lock = self._append_locks[key] = asyncio.Lock()
        async with lock:
            where = await self._route(topic, partition, deadline)
            if isinstance(where, Refused):
                return ProduceResult(int(where.error)), None
            if isinstance(where, Remote):  # the owning shard applies the acks rule and the timeout itself
                return await where.peer.produce(topic, partition, records, acks, _ms_left(deadline)), None
            outcome = await where.owner.append(records, acks=acks, deadline=deadline)
            return _produce_result(outcome), outcome.durable


_NOT_YET = ProduceResult(int(ErrorCode.unknown_server_error))  # a slot start() fills before answering


def _produce_result(outcome: AppendOutcome) -> ProduceResult:
    return ProduceResult(int(outcome.error), outcome.base_offset, outcome.log_append_time, outcome.log_start_offset,
                         outcome.message, outcome.record_errors)


def _ms_left(deadline: float) -> int:
    return max(int((deadline - asyncio.get_running_loop().time()) * 1000), 1)
