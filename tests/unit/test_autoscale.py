"""The scaling policy (kafscale.cluster.autoscale) against recorded load series: each series gives the cluster's
total busy at every second; the helpers spread it over the shards that exist and apply every decision, as the
controller would once the shards are started or drained."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest

from kafscale.cluster.autoscale import Autoscaler, AutoscaleSettings, Decision
from kafscale.cluster.load import PartitionLoad, ShardLoad


def shard(shard_id: int, *partitions: tuple[str, int, float]) -> ShardLoad:
    """A report whose busy is the sum of its partitions' busy: bytes stand in for busy, 1 byte/s per 0.001."""
    parts = tuple(PartitionLoad(t, p, busy * 1000, 0.0) for t, p, busy in partitions)
    busy = sum(b for _, _, b in partitions)
    return ShardLoad(shard_id, busy, busy * 1000, 0.0, 10.0, 2.0, parts)


def even(total: float, shards: int) -> list[ShardLoad]:
    """`total` busy spread evenly over `shards` shards, four partitions each."""
    return [shard(s, *((f"t{s}", p, total / shards / 4) for p in range(4))) for s in range(shards)]


def run(series: Callable[[float], float], seconds: int, start: int, settings: AutoscaleSettings,
        report: Callable[[float, int], list[ShardLoad]] = even) -> list[int]:
    """The shard count after each second's decision (index t = second t)."""
    scaler, current, counts = Autoscaler(settings), start, []
    for t in range(seconds):
        current = scaler.decide(float(t), current, report(series(t), current)).desired
        counts.append(current)
    return counts


def changes(counts: list[int]) -> int:
    return sum(1 for a, b in itertools.pairwise(counts) if a != b)


SETTINGS = AutoscaleSettings(max_shards=4)  # target 0.6, up after 10 s, down after 120 s, down band 0.45


def test_steady_load_never_changes_the_count() -> None:
    # 1.0 busy on 2 shards: 0.5 each, under the target; on 1 it would be 1.0, over it.
    assert set(run(lambda t: 1.0, 3600, 2, SETTINGS)) == {2}


def test_a_spike_shorter_than_the_up_delay_does_not_scale() -> None:
    counts = run(lambda t: 2.0 if 100 <= t < 108 else 0.5, 600, 1, SETTINGS)
    assert set(counts) == {1}


def test_a_spike_that_lasts_the_up_delay_scales_up_once_the_delay_has_passed() -> None:
    counts = run(lambda t: 1.0 if 100 <= t < 130 else 0.5, 130, 1, SETTINGS)
    assert counts[109] == 1 and counts[110] == 2
    assert set(counts[110:]) == {2}


def test_a_ramp_scales_up_one_step_at_a_time_up_to_max_and_never_beyond() -> None:
    counts = run(lambda t: t / 100, 900, 1, SETTINGS)  # 0 → 9 busy, far past 4 shards' worth
    assert counts[-1] == 4 and max(counts) == 4
    steps = [b - a for a, b in itertools.pairwise(counts) if a != b]
    assert steps == [1, 1, 1]
    when = [t for t in range(1, len(counts)) if counts[t] != counts[t - 1]]
    # Each step only after its own full up delay: the load crossed n × 0.6 at t = 60 n.
    assert all(w >= 60 * n + 10 for n, w in zip((1, 2, 3), when, strict=True))


def test_one_hot_partition_gets_one_shard_of_its_own_and_no_more() -> None:
    # One partition saturates a shard (1.0), the rest need 0.5: 1.5 in all, 3 shards at the 0.6 target,
    # but a third shard would not take anything off the hot one.
    def report(total: float, current: int) -> list[ShardLoad]:
        if current == 1:
            return [shard(0, ("hot", 0, 1.0), *(("t", p, 0.1) for p in range(5)))]
        return [shard(0, ("hot", 0, 1.0)), shard(1, *(("t", p, 0.1) for p in range(5))),
                *(shard(s) for s in range(2, current))]

    scaler = Autoscaler(SETTINGS)
    counts, current, reasons = [], 1, []
    for t in range(1200):
        decision = scaler.decide(float(t), current, report(0, current))
        current = decision.desired
        counts.append(current)
        reasons.append(decision.reason)
    assert counts[-1] == 2 and max(counts) == 2 and changes(counts) == 1
    assert "a shard each for hot hot[0] at 1.00" in reasons[-1]
    assert not decision.rebalance  # shard 0 runs above the target with the hot partition alone: nothing to move


def test_load_oscillating_quickly_around_the_up_threshold_never_scales() -> None:
    # 2 shards hold up to 1.2 at the target: 1.1 and 1.3 alternate every 5 s, shorter than the up delay.
    counts = run(lambda t: 1.3 if (t // 5) % 2 else 1.1, 7200, 2, SETTINGS)
    assert changes(counts) == 0


def test_load_oscillating_slowly_around_the_threshold_scales_once_and_does_not_flap() -> None:
    # 1.1 and 1.3 for 200 s each, longer than both delays: up to 3 once, and 3 never come back down to 2,
    # as 1.1 on 2 shards (0.55) is above the 0.45 down band.
    def slow(t: float) -> float:
        return 1.3 if (t // 200) % 2 else 1.1

    counts = run(slow, 7200, 2, SETTINGS)
    assert changes(counts) == 1 and counts[-1] == 3
    # Without the band (down to n as soon as the load fits n at the target) the same series flaps.
    no_band = AutoscaleSettings(max_shards=4, downscale_factor=0.999)
    assert changes(run(slow, 7200, 2, no_band)) >= 10


def test_idle_shrinks_to_the_minimum_after_the_down_delay_and_not_before() -> None:
    settings = AutoscaleSettings(min_shards=2, max_shards=4)
    counts = run(lambda t: 0.0, 300, 4, settings)
    assert counts[119] == 4 and counts[120] == 2
    assert set(counts[120:]) == {2}


def test_a_reading_that_does_not_want_the_scale_down_restarts_its_delay() -> None:
    counts = run(lambda t: 1.0 if t == 100 else 0.0, 400, 3, SETTINGS)  # 1.0 fits 3 but not 1 or 2 in the band
    assert counts[219] == 3 and counts[220] == 3 and counts[221] == 1


def test_missing_reports_never_scale_down() -> None:
    scaler, current = Autoscaler(SETTINGS), 3
    decisions: list[Decision] = []
    for t in range(800):
        loads = even(0.0, current)
        decisions.append(scaler.decide(float(t), current, loads[:2] if t < 500 else loads))  # shard 2 silent
        current = decisions[-1].desired
    assert all(d.desired == 3 for d in decisions[:620])
    assert "1 not reported" in decisions[499].reason
    assert decisions[620].desired == 1  # 120 s after all three report


def test_shards_wanted_but_not_running_do_not_hold_a_scale_down() -> None:
    # 3 wanted, one fits on no node and never starts: the 2 running report idle, and the count still falls.
    scaler, current = Autoscaler(SETTINGS), 3
    decisions = []
    for t in range(200):
        decisions.append(scaler.decide(float(t), current, even(0.0, 2), running=min(current, 2)))
        current = decisions[-1].desired
    assert decisions[119].desired == 3 and decisions[120].desired == 1, decisions[120].reason
    # The same reports with the third shard running (and silent) hold it: it may carry the load.
    scaler = Autoscaler(SETTINGS)
    assert all(scaler.decide(float(t), 3, even(0.0, 2), running=3).desired == 3 for t in range(200))
    # So does no report at all, even with no shard counted as running.
    scaler = Autoscaler(SETTINGS)
    assert all(scaler.decide(float(t), 3, [], running=0).desired == 3 for t in range(200))


def test_missing_reports_still_allow_a_scale_up_on_what_is_reported() -> None:
    scaler = Autoscaler(SETTINGS)
    # Shard 2 just started and has not reported: 2.0 busy on the other two needs 4 shards.
    assert scaler.decide(0.0, 3, even(2.0, 2)).desired == 3
    decision = scaler.decide(10.0, 3, even(2.0, 2))
    assert decision.desired == 4 and "over 2 of 3 shards reporting" in decision.reason


def test_an_imbalance_that_the_count_can_carry_is_left_to_the_balancer() -> None:
    scaler = Autoscaler(SETTINGS)
    loads = [shard(0, *(("t", p, 0.3) for p in range(3))), shard(1, ("t", 3, 0.1))]  # 1.0 fits 2
    decisions = [scaler.decide(float(t), 2, loads) for t in range(600)]
    assert all(d.desired == 2 and d.rebalance for d in decisions)
    assert "shard 0 at 0.90" in decisions[-1].reason and "rebalance" in decisions[-1].reason


def test_counts_outside_min_and_max_are_corrected_at_once() -> None:
    settings = AutoscaleSettings(min_shards=2, max_shards=3)
    assert Autoscaler(settings).decide(0.0, 0, []).desired == 2
    assert Autoscaler(settings).decide(0.0, 5, even(0.0, 5)).desired == 3


def test_load_past_max_holds_at_max_and_says_so() -> None:
    scaler = Autoscaler(AutoscaleSettings(max_shards=2))
    decisions = [scaler.decide(float(t), 2, even(3.0, 2)) for t in range(60)]
    assert {d.desired for d in decisions} == {2} and not any(d.change for d in decisions)
    assert "needs 5, held at max_shards 2" in decisions[-1].reason


def test_a_scale_up_jumps_to_what_was_needed_throughout_the_delay() -> None:
    scaler = Autoscaler(SETTINGS)
    assert scaler.decide(0.0, 1, even(2.3, 1)).desired == 1  # needs 4
    assert scaler.decide(5.0, 1, even(1.1, 1)).desired == 1  # needs 2
    decision = scaler.decide(10.0, 1, even(2.3, 1))
    assert (decision.desired, decision.change) == (2, True)
    assert "scale up to 2" in decision.reason and "total busy 2.30" in decision.reason
    # The next step waits its own full delay from the new count.
    assert [scaler.decide(float(t), 2, even(2.3, 2)).desired for t in range(11, 22)] == [2] * 10 + [4]


def test_a_scale_down_settles_on_the_most_shards_wanted_throughout_its_delay() -> None:
    # 0.8 busy fits 2 shards in the down band, then the load stops: at 120 s, 2 (what was wanted throughout),
    # and 1 only after another full delay, counted from the first reading of the 2 (t = 121).
    counts = run(lambda t: 0.8 if t < 100 else 0.0, 300, 4, SETTINGS)
    assert counts[119] == 4 and counts[120] == 2
    assert counts[240] == 2 and counts[241] == 1


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"min_shards": 0, "max_shards": 1}, "min_shards must be at least 1, got 0"),
    ({"min_shards": 3, "max_shards": 2}, r"max_shards \(2\) must be at least min_shards \(3\)"),
    ({"max_shards": 2, "target_utilization": 0.0}, r"target_utilization must be in \(0, 1\], got 0.0"),
    ({"max_shards": 2, "target_utilization": 1.5}, r"target_utilization must be in \(0, 1\], got 1.5"),
    ({"max_shards": 2, "scale_up_delay_s": -1}, "scale delays must be at least 0 s, got up -1"),
    ({"max_shards": 2, "scale_down_delay_s": -1}, "scale delays must be at least 0 s, got up 10.0, down -1"),
    ({"max_shards": 2, "downscale_factor": 1.0}, r"downscale_factor must be in \(0, 1\), got 1.0"),
])
def test_settings_name_what_is_wrong(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AutoscaleSettings(**kwargs)  # type: ignore[arg-type]


def test_the_down_band_defaults_to_three_quarters_of_the_target() -> None:
    assert math.isclose(AutoscaleSettings(max_shards=2, target_utilization=0.8).downscale_utilization, 0.6)
