"""A planned move's first half on the shard (ShardCore.release), with the real embedded stores: requests wait
through a hand-off, and one the controller never finishes (its placement write failed, or it died) rolls back:
the partition is served here again, nothing acknowledged lost, offsets going on where they stopped."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from kafscale.broker import handoff
from kafscale.broker.routing import Refused
from kafscale.broker.shard import ShardCore
from kafscale.config import BrokerConfig
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.local_store import LocalDirStore
from tests.unit.fake_broker import record_batch

HOLD_S = 1.0


@pytest.fixture
async def core(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ShardCore]:
    monkeypatch.setattr(handoff, "HANDOFF_HOLD_S", HOLD_S)
    shard = ShardCore(0, BrokerConfig(listen="127.0.0.1:0", flush_interval_ms=10),
                      meta=EmbeddedStore(tmp_path / "meta.db"), objects=LocalDirStore(tmp_path / "objects"))
    await shard.start()
    await shard.topics.create("moving", 1, [0])
    try:
        yield shard
    finally:
        await shard.stop()
        await shard.meta.close()


async def test_a_hand_off_never_completed_is_served_here_again_where_it_stopped(core: ShardCore) -> None:
    first = await core.produce("moving", 0, record_batch(b"a", b"b"), acks=-1, timeout_ms=5000)
    assert (first.error, first.base_offset) == (0, 0)
    end = await core.release("moving", 0)
    assert end == 2, "release answers the end offset it committed"

    loop = asyncio.get_running_loop()
    started = loop.time()
    # The placement write that would name a successor never comes: the request waits out the hold, then the
    # partition is this shard's again.
    again = await core.produce("moving", 0, record_batch(b"c"), acks=-1, timeout_ms=5000)
    waited = loop.time() - started
    assert (again.error, again.base_offset) == (0, 2), again
    assert HOLD_S * 0.9 <= waited < HOLD_S + 2, f"waited {waited:.2f} s for a {HOLD_S} s hold"
    assert not core.handoffs.holds(("moving", 0))

    owner = await core.owner("moving", 0)
    assert owner.high_watermark == 3


async def test_a_request_within_its_deadline_is_refused_retriably_not_lost(core: ShardCore) -> None:
    await core.produce("moving", 0, record_batch(b"a"), acks=-1, timeout_ms=5000)
    await core.release("moving", 0)
    # A deadline shorter than the hold: the request is answered (not queued for ever) with a retriable error,
    # and what was acknowledged before stays.
    loop = asyncio.get_running_loop()
    route = await core.route("moving", 0, deadline=loop.time() + 0.2)
    assert isinstance(route, Refused) and route.error == ErrorCode.not_leader_or_follower, route
    await asyncio.sleep(HOLD_S)
    after = await core.produce("moving", 0, record_batch(b"b"), acks=-1, timeout_ms=5000)
    assert (after.error, after.base_offset) == (0, 1)


async def test_releasing_a_virtual_partition_releases_its_physical_partitions_others(core: ShardCore) -> None:
    await core.topics.create("virtual", 6, [0], physical=2)
    for p in range(6):
        assert (await core.produce("virtual", p, record_batch(b"x"), acks=-1, timeout_ms=5000)).error == 0
    await core.release("virtual", 3)  # physical partition 1: virtual partitions 1, 3 and 5
    loop = asyncio.get_running_loop()
    for p in range(6):
        route = await core.route("virtual", p, deadline=loop.time() + 0.1)
        assert isinstance(route, Refused) == (p % 2 == 1), (p, route)
