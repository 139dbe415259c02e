"""The shard's load meter: rates from counters the data path keeps, sampled off it (kafscale.ops.load_meter)."""

from __future__ import annotations

import pytest

from kafscale.broker.stats import PartitionStats, ShardStats
from kafscale.cluster.load import PartitionLoad, ShardLoad
from kafscale.ops.load_meter import LoadMeter


class Clocks:
    def __init__(self) -> None:
        self.wall = 100.0
        self.cpu = 5.0
        self.requests = 0
        self.parts: list[PartitionStats] = []

    def stats(self) -> ShardStats:
        return ShardStats(0, 1, 0, 0, 0, 0, 0, tuple(self.parts))


def meter(c: Clocks, cpus: float = 1.0) -> LoadMeter:
    return LoadMeter(7, c.stats, lambda: c.requests, cpus, clock=lambda: c.wall, cpu_clock=lambda: c.cpu)


def test_rates_are_the_growth_of_the_counters_over_the_interval() -> None:
    c = Clocks()
    m = meter(c)
    c.parts = [PartitionStats("t", 0, 0, 0, bytes_in=2_000, bytes_out=500), PartitionStats("t", 1, 0, 0, 1_000, 0)]
    c.wall += 2.0
    c.cpu += 0.5
    c.requests += 40
    load = m.sample()
    assert load == ShardLoad(7, busy=0.25, bytes_in=1_500.0, bytes_out=250.0, requests=20.0, interval_s=2.0,
                             partitions=(PartitionLoad("t", 0, 1_000.0, 250.0), PartitionLoad("t", 1, 500.0, 0.0)))
    assert m.latest is load
    c.parts = [PartitionStats("t", 0, 0, 0, bytes_in=6_000, bytes_out=500)]  # t-1 moved away
    c.wall += 4.0
    load = m.sample()
    assert (load.busy, load.requests, load.partitions) == (0.0, 0.0, (PartitionLoad("t", 0, 1_000.0, 0.0),))


def test_a_reopened_owner_counts_from_zero() -> None:
    c = Clocks()
    m = meter(c)
    c.parts = [PartitionStats("t", 0, 0, 0, bytes_in=10_000)]
    c.wall += 1.0
    m.sample()
    c.parts = [PartitionStats("t", 0, 0, 0, bytes_in=3_000)]  # moved away and back: a new owner's counters
    c.wall += 1.0
    assert m.sample().partitions == (PartitionLoad("t", 0, 3_000.0, 0.0),)


def test_busy_is_against_the_cpus_the_shard_may_use_and_never_less_than_one_core() -> None:
    c = Clocks()
    two, half = meter(c, cpus=2.0), meter(c, cpus=0.5)
    c.wall += 1.0
    c.cpu += 1.5
    assert two.sample().busy == 0.75
    assert half.sample().busy == 1.5  # one event loop: a shard asking Ray for half a core can still use one


def test_partition_busy_shares_the_shards_busy_by_bytes() -> None:
    load = ShardLoad(1, busy=0.8, bytes_in=300.0, bytes_out=100.0, requests=10.0, interval_s=2.0,
                     partitions=(PartitionLoad("a", 0, 300.0, 0.0), PartitionLoad("a", 1, 0.0, 100.0)))
    assert load.partition_busy() == pytest.approx({("a", 0): 0.6, ("a", 1): 0.2})
    idle = ShardLoad(1, 0.1, 0.0, 0.0, 0.0, 2.0, (PartitionLoad("a", 0, 0.0, 0.0),))
    assert idle.partition_busy() == {("a", 0): 0.0}


def test_a_physical_partitions_virtual_partitions_are_one_load() -> None:
    c = Clocks()
    m = meter(c)
    c.parts = [PartitionStats("v", 0, 0, 0, bytes_in=1_000, unit=0), PartitionStats("v", 2, 0, 0, 3_000, 100, unit=0),
               PartitionStats("v", 1, 0, 0, bytes_in=500, unit=1)]
    c.wall += 1.0
    load = m.sample()
    assert sorted(load.partitions, key=lambda p: p.partition) == [PartitionLoad("v", 0, 4_000.0, 100.0),
                                                                   PartitionLoad("v", 1, 500.0, 0.0)]
