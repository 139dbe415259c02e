"""DurableWait: an acks=all request answered from its partitions' durability callbacks, or at its deadline."""

from __future__ import annotations

import asyncio

import pytest

from kafscale.broker.partition_owner import PartitionError
from kafscale.broker.produce_wait import DurableWait
from kafscale.broker.results import ProduceResult
from kafscale.protocol.errors import ErrorCode


def _results(n: int) -> list[ProduceResult]:
    return [ProduceResult(0, base_offset=i) for i in range(n)]


async def test_answers_once_every_partition_is_durable_with_each_partitions_own_outcome() -> None:
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in range(3)]
    results = _results(3)
    wait = DurableWait(loop, dict(zip(futures, results, strict=True)), loop.time() + 10, lambda: list(results))
    futures[0].set_result(None)
    futures[2].set_exception(PartitionError(ErrorCode.not_leader_or_follower))
    await asyncio.sleep(0)
    assert not wait.future.done()  # one partition is still waiting
    futures[1].set_result(None)
    answer = await asyncio.wait_for(wait.future, 1)
    assert [r.error for r in answer] == [0, 0, int(ErrorCode.not_leader_or_follower)]


async def test_a_failure_that_is_not_a_partition_error_is_unknown_server_error() -> None:
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    results = _results(1)
    wait = DurableWait(loop, {fut: results[0]}, loop.time() + 10, lambda: results)
    fut.set_exception(RuntimeError("bug"))
    assert (await asyncio.wait_for(wait.future, 1))[0].error == int(ErrorCode.unknown_server_error)


async def test_at_the_deadline_the_partitions_still_waiting_time_out_and_are_let_go() -> None:
    loop = asyncio.get_running_loop()
    slow, quick = loop.create_future(), loop.create_future()
    results = _results(2)
    wait = DurableWait(loop, {slow: results[0], quick: results[1]}, loop.time() + 0.05, lambda: results)
    quick.set_result(None)
    answer = await asyncio.wait_for(wait.future, 1)
    assert [r.error for r in answer] == [int(ErrorCode.request_timed_out), 0]
    assert not slow.cancelled()  # other requests may wait on the same segment
    assert slow.remove_done_callback(wait._one_done) == 0  # let go: nothing of the request stays attached


async def test_a_deadline_already_past_answers_on_the_next_loop_iteration() -> None:
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    results = _results(1)
    wait = DurableWait(loop, {fut: results[0]}, loop.time() - 1, lambda: results)
    assert (await asyncio.wait_for(wait.future, 1))[0].error == int(ErrorCode.request_timed_out)


async def test_a_cancelled_wait_never_builds_its_answer() -> None:
    """The listener cancels the answers of a connection that went away."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    built = []
    wait = DurableWait(loop, {fut: {"error": 0}}, loop.time() + 10, lambda: built.append(1))
    wait.future.cancel()
    fut.set_result(None)
    await asyncio.sleep(0.01)
    assert built == []


async def test_an_answer_that_cannot_be_built_fails_the_future() -> None:
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def broken() -> None:
        raise ValueError("cannot encode")

    wait = DurableWait(loop, {fut: {"error": 0}}, loop.time() + 10, broken)
    fut.set_result(None)
    with pytest.raises(ValueError, match="cannot encode"):
        await asyncio.wait_for(wait.future, 1)
