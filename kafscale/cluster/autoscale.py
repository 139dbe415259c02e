"""The scaling policy: how many shards the measured load needs (Ray Serve's autoscaler is the model).

Pure decisions, no I/O: the controller (kafscale.actors.controller) feeds it the shards' load reports and
starts or drains shards to follow the returned Decision; kafscale.cluster.assign.balance_by_load spreads the
work over them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kafscale.cluster.load import ShardLoad

_EPS = 1e-9  # busy figures are float sums: 1.2 busy at a 0.6 target needs 2 shards, not 3


@dataclass(frozen=True, kw_only=True, slots=True)
class AutoscaleSettings:
    max_shards: int
    min_shards: int = 1
    target_utilization: float = 0.6  # the busy fraction a shard should run at
    scale_up_delay_s: float = 10.0  # short: a lasting overload costs latency now
    scale_down_delay_s: float = 120.0  # long: every drain pauses its partitions' producers
    # Hysteresis: a scale-down must leave the remaining shards at or below target × downscale_factor, not merely
    # at the target. Scaling up from n starts above n × target, scaling back down to n needs the load under
    # n × 0.75 × target: a quarter of the load in between leaves the count as it is, wider than the noise of a
    # sampled CPU fraction, and after a scale-down the shards can take a third more before the next scale-up.
    downscale_factor: float = 0.75

    def __post_init__(self) -> None:
        if self.min_shards < 1:
            raise ValueError(f"min_shards must be at least 1, got {self.min_shards}")
        if self.max_shards < self.min_shards:
            raise ValueError(f"max_shards ({self.max_shards}) must be at least min_shards ({self.min_shards})")
        if not 0 < self.target_utilization <= 1:
            raise ValueError(f"target_utilization must be in (0, 1], got {self.target_utilization}")
        if self.scale_up_delay_s < 0 or self.scale_down_delay_s < 0:
            raise ValueError(f"scale delays must be at least 0 s, got up {self.scale_up_delay_s}, "
                             f"down {self.scale_down_delay_s}")
        if not 0 < self.downscale_factor < 1:  # 1 would be no band at all: the count could flap
            raise ValueError(f"downscale_factor must be in (0, 1), got {self.downscale_factor}")

    @property
    def downscale_utilization(self) -> float:
        return self.target_utilization * self.downscale_factor


@dataclass(frozen=True, slots=True)
class Decision:
    desired: int
    current: int
    reason: str  # the figures that drove it, for the controller's log
    rebalance: bool = False  # the count fits, but a shard runs above the target: balance_by_load's job

    @property
    def change(self) -> bool:
        return self.desired != self.current


class _Wanted:
    """Since when a change of the count has been wanted without a break, and the count to take then."""

    def __init__(self, keep: Callable[[int, int], int]) -> None:
        self.keep = keep  # of two counts wanted at different times, the one wanted throughout
        self.since: float | None = None
        self.count = 0

    def want(self, now: float, count: int) -> float:
        """Wanted now too; returns for how long it has been."""
        if self.since is None:
            self.since, self.count = now, count
        self.count = self.keep(self.count, count)
        return now - self.since

    def take(self) -> int:
        self.since = None
        return self.count

    def reset(self) -> None:
        self.since = None


class Autoscaler:
    """Holds only since when scaling up or down has been wanted; the controller calls decide() on every load
    round. After it acts on a change it must pass the new count as `current` (shards started count at once,
    though they report nothing yet); each further step waits a full delay again, as Ray Serve's does."""

    def __init__(self, settings: AutoscaleSettings) -> None:
        self.settings = settings
        self._up = _Wanted(min)  # scaling up goes to the fewest shards wanted throughout its delay
        self._down = _Wanted(max)  # scaling down to the most

    def decide(self, now: float, current: int, loads: Sequence[ShardLoad], running: int | None = None) -> Decision:
        """`running`: how many of the `current` shards serve and so must report (default all of them). A shard
        wanted but not started yet, waiting for a node, carries no load and cannot forbid a scale-down."""
        s = self.settings
        if not s.min_shards <= current <= s.max_shards:  # settings, not load: no delay
            self._up.reset()
            self._down.reset()
            desired = min(max(current, s.min_shards), s.max_shards)
            return Decision(desired, current, f"{current} shards outside [{s.min_shards}, {s.max_shards}]")
        reports = {load.shard_id: load for load in loads}  # the latest report of each shard
        total = sum(r.busy for r in reports.values())
        # A partition busier than the target alone cannot be helped by more shards than one of its own: it
        # counts as one shard, so a hot partition never makes the count grow past that.
        hot = sorted(((busy, key) for r in reports.values() for key, busy in r.partition_busy().items()
                      if busy > s.target_utilization + _EPS), key=lambda bk: (-bk[0], bk[1]))
        rest = max(total - sum(busy for busy, _ in hot), 0.0)
        needed = len(hot) + math.ceil(rest / s.target_utilization - _EPS)
        up = self._clamp(needed)
        down = self._clamp(len(hot) + math.ceil(rest / s.downscale_utilization - _EPS))
        figures = (f"total busy {total:.2f} over {len(reports)} of {current} shards reporting "
                   f"({total / max(len(reports), 1):.2f} each, target {s.target_utilization:.2f})")
        if hot:
            figures += "; a shard each for hot " + ", ".join(f"{t}[{p}] at {busy:.2f}" for busy, (t, p) in hot)

        if up > current:
            self._down.reset()
            waited = self._up.want(now, up)
            if waited < s.scale_up_delay_s:
                return Decision(current, current, f"{figures}: needs {up}, wanted for {waited:.0f} of "
                                                  f"{s.scale_up_delay_s:.0f} s before scaling up")
            desired = self._up.take()
            return Decision(desired, current, f"scale up to {desired}: {figures}; wanted for {waited:.0f} s")
        self._up.reset()

        # A shard that serves and did not report may carry the load that forbids a scale-down; so may the
        # whole cluster when nothing reports at all.
        missing = max((current if running is None else running) - len(reports), 0 if reports else 1)
        if down < current and missing <= 0:
            waited = self._down.want(now, down)
            if waited < s.scale_down_delay_s:
                return Decision(current, current, f"{figures}: {down} would do, wanted for {waited:.0f} of "
                                                  f"{s.scale_down_delay_s:.0f} s before scaling down")
            desired = self._down.take()
            return Decision(desired, current, f"scale down to {desired}: {figures}; at most "
                                              f"{s.downscale_utilization:.2f} each after, wanted for {waited:.0f} s")
        self._down.reset()

        if down < current:
            return Decision(current, current, f"{figures}: {missing} not reported, no scale-down on missing data")
        if needed > current:  # current == max_shards
            return Decision(current, current, f"{figures}: needs {needed}, held at max_shards {s.max_shards}")
        # More shards would not help a shard above the target: the balancer moves work off it onto the idle ones
        # (unless it holds one partition, then a hot one, with nothing to give).
        over = sorted((r for r in reports.values() if r.busy > s.target_utilization + _EPS and len(r.partitions) > 1),
                      key=lambda r: r.shard_id)
        if over:
            shards = ", ".join(f"{r.shard_id} at {r.busy:.2f}" for r in over)
            return Decision(current, current, f"{figures}: the total fits {current} but shard {shards} runs above "
                                              f"the target: rebalance, not scale", rebalance=True)
        return Decision(current, current, f"{figures}: {current} fit")

    def _clamp(self, shards: int) -> int:
        return min(max(shards, self.settings.min_shards), self.settings.max_shards)
