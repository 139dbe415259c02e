"""The ListOffsets handler (v1+) over the fake broker: which special timestamps each version knows, a partition
named twice, and the leader epoch of an offset found. Kafka's own answers to the same requests are compared on
the wire in tests/differential/test_list_offsets.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from kafscale.acceptor.handlers import list_offsets
from kafscale.protocol.errors import ErrorCode
from tests.unit.fake_broker import FakeBroker, context, fake_broker, record_batch
from tests.unit.test_handlers import part, request


async def ask(broker: FakeBroker, version: int, queries: list[tuple[int, int]]
              ) -> list[tuple[int, ErrorCode, int, Any]]:
    """ListOffsets of (partition, timestamp) of topic t: (partition, error, offset, leader epoch) per answer."""
    parts = tuple(part(2, version, "ListOffsetsPartition", partition_index=p, current_leader_epoch=-1, timestamp=ts)
                  for p, ts in queries)
    answer = await list_offsets.handle(broker, context(2, version), request(
        2, version, replica_id=-1, isolation_level=0,
        topics=(part(2, version, "ListOffsetsTopic", name="t", partitions=parts),)))
    return [(p.partition_index, p.error_code, p.offset, getattr(p, "leader_epoch", None))
            for t in answer.topics for p in t.partitions]


async def test_special_timestamps_need_their_version(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 1, [0])
        unsupported = ErrorCode.unsupported_version
        assert [a[1] for a in await ask(broker, 6, [(0, -3)])] == [unsupported]  # max timestamp: v7
        assert [a[1] for a in await ask(broker, 7, [(0, -4)])] == [unsupported]  # earliest local: v8
        assert [a[1] for a in await ask(broker, 8, [(0, -5)])] == [unsupported]  # latest tiered: v9
        assert [a[1] for a in await ask(broker, 8, [(0, -7)])] == [unsupported]  # never
        assert await ask(broker, 8, [(0, -4)]) == [(0, ErrorCode.none, 0, 0)]  # the log start, as -2


async def test_a_partition_named_twice_is_answered_once(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 2, [0])
        assert await ask(broker, 8, [(0, -1), (1, -1), (0, -2)]) == [
            (0, ErrorCode.invalid_request, -1, -1), (1, ErrorCode.none, 0, 0)]


async def test_the_leader_epoch_of_an_offset_found_is_the_partitions(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        await broker.topics.create("t", 1, [0])
        await broker.produce("t", 0, record_batch(b"a"), -1, 1000)
        assert await ask(broker, 8, [(0, -2)]) == [(0, ErrorCode.none, 0, 0)]  # a new partition's epoch
        await broker.topics.modify("t", lambda i: dataclasses.replace(i, leader_epochs=[3]))  # moved three times
        assert await ask(broker, 8, [(0, -1)]) == [(0, ErrorCode.none, 1, 3)]
        assert await ask(broker, 8, [(5, -1)]) == [(5, ErrorCode.unknown_topic_or_partition, -1, -1)]
