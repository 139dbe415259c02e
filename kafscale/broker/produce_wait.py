"""Waiting for an acks=all Produce request's records to become durable, by callbacks instead of a task.

librdkafka sends one Produce request per partition and linger, so a shard at 16 partitions answers
thousands of them a second, each waiting for its segment's commit. A task per request with
`asyncio.wait` costs several futures, callbacks and loop iterations each; here a request costs one
future, one callback per partition and one timer for its deadline. The partition owners' futures are
never cancelled: other requests may wait on the same segment.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

from kio.schema.errors import ErrorCode

from kafscale.broker.partition_owner import PartitionError
from kafscale.broker.results import ProduceResult

T = TypeVar("T")


class DurableWait(Generic[T]):
    """`future` completes with then() once every future in `waiting` is done, or at `deadline` (event loop
    time). Before then() runs, the result of each future that failed or is still waiting takes its error:
    the partition's own error code, or REQUEST_TIMED_OUT."""

    __slots__ = ("_left", "_then", "_timer", "_waiting", "future")

    def __init__(self, loop: asyncio.AbstractEventLoop, waiting: dict[asyncio.Future[None], ProduceResult],
                 deadline: float, then: Callable[[], T]) -> None:
        self.future: asyncio.Future[T] = loop.create_future()
        self._waiting = waiting
        self._left = len(waiting)
        self._then = then
        self._timer = loop.call_at(deadline, self._finish)
        for fut in waiting:
            fut.add_done_callback(self._one_done)

    def _one_done(self, _: asyncio.Future[None]) -> None:
        self._left -= 1
        if self._left == 0:
            self._finish()

    def _finish(self) -> None:
        self._timer.cancel()
        if self.future.done():  # cancelled: the connection went away
            return
        for fut, result in self._waiting.items():
            if not fut.done():
                fut.remove_done_callback(self._one_done)
                result.error = int(ErrorCode.request_timed_out)
            elif (exc := fut.exception()) is not None:
                code = exc.code if isinstance(exc, PartitionError) else ErrorCode.unknown_server_error
                result.error = int(code)
        try:
            self.future.set_result(self._then())
        except Exception as e:
            self.future.set_exception(e)


async def wait_durable(waiting: dict[asyncio.Future[None], ProduceResult], deadline: float) -> None:
    """The same as a coroutine, for the paths that run in a task anyway (queued partitions)."""
    if waiting:
        await DurableWait(asyncio.get_running_loop(), waiting, deadline, lambda: None).future
