"""OffsetFetch asked of a shard that does not coordinate the group (a client's coordinator has just moved): the
shard asks the coordinator instead of answering NOT_COORDINATOR, on which librdkafka's admin client crashes
(librdkafka#5040: its ListConsumerGroupOffsets dereferences a consumer group it does not have). Two shards in
this process on a real etcd, each other's peers, as shard actors are through Ray."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from kafscale.broker.shard import ShardCore
from kafscale.cluster.membership import BrokerRecord
from kafscale.config import BrokerConfig
from kafscale.groups.offsets import OffsetEntry
from kafscale.storage.etcd_store import EtcdStore
from kafscale.storage.local_store import LocalDirStore


@pytest.fixture
async def pair(etcd_store: EtcdStore, tmp_path: Path) -> AsyncIterator[list[ShardCore]]:
    cores: list[ShardCore] = []
    for shard_id in (0, 1):
        cores.append(ShardCore(shard_id, BrokerConfig(listen="127.0.0.1:0"), meta=etcd_store,
                               objects=LocalDirStore(tmp_path / "objects"), shards=[], peers=lambda s: cores[s]))
    for core in cores:
        await core.start()
        await core.join(BrokerRecord(core.shard_id, "127.0.0.1", 9000 + core.shard_id))
    deadline = time.monotonic() + 10
    while not all(c.placement.live(0) and c.placement.live(1) for c in cores):
        assert time.monotonic() < deadline, "the shards never saw each other"
        await asyncio.sleep(0.05)
    try:
        yield cores
    finally:
        for core in cores:
            await core.stop()


async def test_offsets_asked_of_the_wrong_shard_come_from_the_coordinator(pair: list[ShardCore]) -> None:
    group = next(g for g in (f"group-{i}" for i in range(100)) if pair[0].placement.coordinator_of(g) == 0)
    await pair[0].topics.create("t", 2, [0, 1])
    error, coordinator = await pair[0].groups.lookup(group, create=True)
    assert error == ErrorCode.none and coordinator is not None
    committed = await coordinator.commit("", None, -1, [("t", 1, OffsetEntry(42, -1, "m", int(time.time() * 1000)))])
    assert committed == {("t", 1): ErrorCode.none}

    assert (await pair[1].groups.lookup(group))[0] == ErrorCode.not_coordinator  # as a client would meet it
    answer = await pair[1].group_offsets(group)
    assert answer.error == ErrorCode.none
    assert {tp: e.offset for tp, e in answer.offsets.items()} == {("t", 1): 42}


async def test_a_forwarded_ask_is_answered_where_it_lands_never_passed_on_again(pair: list[ShardCore]) -> None:
    group = next(g for g in (f"group-{i}" for i in range(100)) if pair[0].placement.coordinator_of(g) == 0)
    # A forwarded ask is answered where it lands, never forwarded again (two shards with different views of the
    # cluster would otherwise pass it back and forth).
    answer = await pair[1].group_offsets(group, forwarded=True)
    assert answer.error == ErrorCode.not_coordinator
