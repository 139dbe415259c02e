"""Producer-id expiry (kafscale.broker.producer_expiry) on one partition owner, on the real embedded stores: which
producers are forgotten, durably, and which stay."""

from __future__ import annotations

import time

from kafscale.cluster import keys
from tests.strategies import BatchSpec, Record, build_batch
from tests.unit.test_partition_owner import TOPIC, Env, batch, durable

DAY = 86_400_000


async def test_idle_producers_are_forgotten_and_busy_or_transactional_ones_stay(env: Env) -> None:
    now = int(time.time() * 1000)
    owner = await env.owner()
    await durable(await owner.append(batch([b"old"], pid=7, epoch=0, seq=0, ts=now - 2 * DAY), acks=-1))
    await durable(await owner.append(batch([b"recent"], pid=8, epoch=0, seq=0, ts=now - 1000), acks=-1))
    in_txn = build_batch(BatchSpec(0, True, 9, 0, 0, (Record(now - 2 * DAY, None, b"open", ()),)))
    await durable(await owner.append(in_txn, acks=-1))  # an open transaction: never expires
    await durable(await owner.append(batch([b"exactly"], pid=10, epoch=0, seq=0, ts=now - DAY), acks=-1))

    assert sorted(await owner.expire_producers(now, DAY)) == [7, 10]
    assert sorted(owner.producers.entries) == [8, 9]
    stored = sorted(int(kv.key.rsplit("/", 1)[1]) for kv in await env.meta.range(keys.producers(TOPIC, 0)))
    assert stored == [8, 9]
    assert await owner.expire_producers(now, DAY) == []
    await owner.close()
    again = await env.owner()
    assert sorted(again.producers.entries) == [8, 9]  # durable
    # Forgotten, it is a new producer to the partition: its next batch, from any sequence, is taken as Kafka takes it.
    outcome = await again.append(batch([b"back"], pid=7, epoch=0, seq=1, ts=now), acks=-1)
    await durable(outcome)
    assert sorted(again.producers.entries) == [7, 8, 9]


async def test_a_producer_with_batches_not_yet_committed_stays(env: Env) -> None:
    now = int(time.time() * 1000)
    owner = await env.owner(flush_interval_ms=60_000)  # the batch waits in the open window
    outcome = await owner.append(batch([b"old stamp"], pid=7, epoch=0, seq=0, ts=now - 2 * DAY), acks=1)
    assert outcome.error == 0
    assert await owner.expire_producers(now, DAY) == []
    assert list(owner.producers.entries) == [7]


async def test_more_idle_producers_than_one_store_transaction_takes(env: Env) -> None:
    now = int(time.time() * 1000)
    owner = await env.owner()
    for pid in range(300):
        outcome = await owner.append(batch([b"x"], pid=1000 + pid, epoch=0, seq=0, ts=now - 2 * DAY), acks=-1)
    await durable(outcome)
    assert len(await owner.expire_producers(now, DAY)) == 300
    assert owner.producers.entries == {}
    assert await env.meta.range(keys.producers(TOPIC, 0)) == []
