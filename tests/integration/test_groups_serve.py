"""Group state and committed offsets survive kill -9 of `kafscale serve` (two shards on Ray).

The groups are chosen to hash to shard 1, so clients bootstrapping from shard 0 must follow FindCoordinator,
and a request sent to shard 0 gets NOT_COORDINATOR.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafscale.protocol.errors import ErrorCode
from kafscale.testing.serve_process import START_TIMEOUT_S, ServeProcess
from tests.integration.conftest import KafkaWire
from tests.integration.test_groups_wire import heartbeat, join, req, sync

PARTITIONS, RECORDS = 6, 600
DESCRIBE = 15


def group_on_shard(prefix: str, shard: int, shards: int = 2) -> str:
    return next(g for i in range(1000) if zlib.crc32((g := f"{prefix}-{i}").encode()) % shards == shard)


def consumer(bootstrap: str, group: str) -> Consumer:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000})
    c.subscribe(["orders"])
    return c


def consume(c: Consumer, n: int, timeout: float = 60) -> list[bytes]:
    got: list[bytes] = []
    while len(got) < n:
        batch = c.consume(n - len(got), timeout)
        assert batch, f"only {len(got)} of {n} records came"
        got += [m.value() for m in batch if not m.error()]
    return got


@pytest.mark.timeout(2 * START_TIMEOUT_S + 300)  # two starts of `kafscale serve`, each may take its whole wait
def test_group_state_and_offsets_survive_kill_9(tmp_path: Path) -> None:
    serve = ServeProcess(tmp_path / "data", shards=2)
    offsets_group, members_group = group_on_shard("resume", 1), group_on_shard("members", 1)
    serve.start()
    try:
        admin = AdminClient({"bootstrap.servers": serve.bootstrap})
        admin.create_topics([NewTopic("orders", PARTITIONS, 1)])["orders"].result(30)
        producer = Producer({"bootstrap.servers": serve.bootstrap, "acks": "all"})
        for i in range(RECORDS):
            producer.produce("orders", value=b"%d" % i, partition=i % PARTITIONS)
        assert producer.flush(30) == 0

        first = consumer(serve.bootstrap, offsets_group)
        seen = consume(first, RECORDS // 2)
        first.commit(asynchronous=False)  # acknowledged: must be durable
        committed = {tp.partition: tp.offset for tp in first.committed(
            [TopicPartition("orders", p) for p in range(PARTITIONS)], 10)}
        first.close()

        with KafkaWire(serve.ports[1]) as wire:
            member = join(wire, members_group)
            assert member.error_code == ErrorCode.none
            sync(wire, members_group, member.member_id, member.generation_id, {member.member_id: b"assignment"})
        with KafkaWire(serve.ports[0]) as wrong_shard:
            assert heartbeat(wrong_shard, members_group, member.member_id, member.generation_id) == \
                ErrorCode.not_coordinator

        serve.kill()
        serve.start()

        with KafkaWire(serve.ports[1]) as wire:
            # The member's session goes on with the restored generation: no re-join needed.
            assert heartbeat(wire, members_group, member.member_id, member.generation_id) == ErrorCode.none
            again = sync(wire, members_group, member.member_id, member.generation_id)
            assert again.error_code == ErrorCode.none and again.assignment == b"assignment"
            described = wire.call(req(DESCRIBE, 5, groups=(members_group,),
                                      include_authorized_operations=False)).groups[0]
            assert described.group_state == "Stable"
            assert [m.member_id for m in described.members] == [member.member_id]

        second = consumer(serve.bootstrap, offsets_group)
        restored = {tp.partition: tp.offset for tp in second.committed(
            [TopicPartition("orders", p) for p in range(PARTITIONS)], 30)}
        assert restored == committed
        rest = consume(second, RECORDS - len(seen))
        second.close()
        assert sorted(int(v) for v in seen + rest) == list(range(RECORDS)), "resumed elsewhere than committed"
    finally:
        serve.kill()

