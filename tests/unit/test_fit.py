"""Where autoscaled shards go (kafscale.cluster.fit): running shards stay, new ones go where there is room."""

from __future__ import annotations

from kafscale.cluster.fit import Fit, fit_shards, node_capacity


def test_running_shards_stay_and_new_ones_spread_to_the_most_room() -> None:
    # b has the most room (2), then a and b tie at 1 left, c has 1: each extra shard to the roomiest node
    assert fit_shards(4, {"a": 2, "b": 2, "c": 1}, {"a": 1}) == Fit({"a": 1, "b": 2, "c": 1}, 0, 5)
    assert fit_shards(2, {"a": 3, "b": 3}, {"a": 1}) == Fit({"a": 1, "b": 1}, 0, 6)


def test_what_fits_nowhere_is_unplaced_for_rays_autoscaler() -> None:
    assert fit_shards(5, {"a": 1, "b": 2}, {}) == Fit({"a": 1, "b": 2}, 2, 3)


def test_fewer_shards_are_never_taken_away_here_and_gone_nodes_count_for_nothing() -> None:
    assert fit_shards(1, {"a": 2, "b": 2}, {"a": 2, "b": 1, "gone": 3}) == Fit({"a": 2, "b": 1}, 0, 4)


def test_a_node_fits_its_cpus_over_the_cpus_a_shard_asks_for() -> None:
    assert [node_capacity(c, 1.0) for c in (None, 0, 0.5, 1, 2.9, 4)] == [0, 0, 0, 1, 2, 4]
    assert node_capacity(4, 1.5) == 2
