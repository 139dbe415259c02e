"""The controller's decisions (kafscale.cluster.assign), as pure functions over assignments."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.cluster.assign import (
    Move,
    Node,
    balance,
    balance_by_load,
    drain,
    free_slot,
    heal,
    pick_to_drain,
    plan_shards,
)
from kafscale.cluster.placement import GROUP_SLOTS, Placement, ShardAddress, group_slot, spread
from kafscale.cluster.topics import TopicInfo


def parts(*shards: int) -> dict[tuple[str, int], int]:
    return {("t", p): s for p, s in enumerate(shards)}


def test_heal_moves_only_the_dead_shards_work_to_the_least_loaded_live_shards() -> None:
    moves = heal(parts(0, 1, 2, 2, 1, 0, 2), live=[0, 1])
    assert {m.item for m in moves} == {("t", 2), ("t", 3), ("t", 6)}
    after = {**parts(0, 1, 2, 2, 1, 0, 2), **{m.item: m.target for m in moves}}
    assert sorted(Counter(after.values()).values()) == [3, 4]


def test_heal_with_an_explicit_dead_set_leaves_shards_in_their_start_up_grace_alone() -> None:
    # Shard 3 is wanted but not registered yet: its work waits; shard 2 is dead.
    moves = heal(parts(0, 2, 3), live=[0, 1], dead={2})
    assert moves == [Move(("t", 1), 2, 1)]


def test_heal_has_nowhere_to_go_without_live_shards() -> None:
    assert heal(parts(0, 1), live=[]) == []


def test_drain_empties_the_leaving_shards() -> None:
    moves = drain(parts(0, 1, 2, 1, 1), leaving={1}, remaining=[0, 1, 2])
    assert {m.item for m in moves} == {("t", 1), ("t", 3), ("t", 4)}
    assert all(m.target in (0, 2) for m in moves)


@given(st.lists(st.integers(0, 5), max_size=60), st.lists(st.integers(0, 7), min_size=1, max_size=6, unique=True))
def test_balance_leaves_every_shard_within_one_item_with_one_move_per_moved_item(
        placed: list[int], shards: list[int]) -> None:
    assignment = parts(*placed)
    moves = balance(assignment, shards)
    assert len({m.item for m in moves}) == len(moves)
    assert all(assignment[m.item] == m.source and m.source != m.target for m in moves)
    after = {**assignment, **{m.item: m.target for m in moves}}
    counts = Counter({s: 0 for s in shards}) + Counter(after.values())
    assert set(after.values()) <= set(shards)
    assert max(counts[s] for s in shards) - min(counts[s] for s in shards) <= 1


def test_balance_spreads_each_topic_not_only_the_counts() -> None:
    # Shard 0 holds all of "busy" and "idle"; shard 1 is new.
    assignment = {**{("busy", p): 0 for p in range(4)}, **{("idle", p): 0 for p in range(4)}}
    moves = balance(assignment, [0, 1])
    moved = Counter(m.item[0] for m in moves)  # type: ignore[index]
    assert moved == {"busy": 2, "idle": 2}


def test_balance_of_an_even_assignment_moves_nothing() -> None:
    assert balance(parts(0, 1, 2, 0, 1, 2), [0, 1, 2]) == []


def shard_loads(assignment: dict[tuple[str, int], int], loads: dict[tuple[str, int], float],
                shards: list[int]) -> dict[int, float]:
    totals = dict.fromkeys(shards, 0.0)
    for item, shard in assignment.items():
        if shard in totals:
            totals[shard] += loads.get(item, 0.0)
    return totals


def apply(assignment: dict[tuple[str, int], int], moves: list[Move]) -> dict[tuple[str, int], int]:
    return {**assignment, **{m.item: m.target for m in moves}}  # type: ignore[dict-item]


def test_balance_by_load_leaves_a_hot_partition_alone_on_its_shard() -> None:
    # Shard 0 holds the hot partition and three others; shard 2 is new.
    assignment = parts(0, 0, 0, 0, 1)
    loads = {("t", 0): 0.9, ("t", 1): 0.1, ("t", 2): 0.1, ("t", 3): 0.1, ("t", 4): 0.1}
    moves = balance_by_load(assignment, loads, [0, 1, 2], max_moves=10)
    after = apply(assignment, moves)
    assert [item for item, shard in after.items() if shard == 0] == [("t", 0)]
    assert ("t", 0) not in {m.item for m in moves}
    assert sorted(shard_loads(after, loads, [0, 1, 2]).values()) == pytest.approx([0.2, 0.2, 0.9])


def test_balance_by_load_evens_a_new_shard_out_in_few_moves() -> None:
    assignment = parts(0, 0, 0, 0, 0, 0)
    loads = dict.fromkeys(assignment, 0.1)
    moves = balance_by_load(assignment, loads, [0, 1], max_moves=10)
    assert len(moves) == 3 and all(m.source == 0 and m.target == 1 for m in moves)


def test_balance_by_load_moves_the_item_that_best_halves_the_gap() -> None:
    assignment = parts(0, 0, 0, 1)
    loads = {("t", 0): 0.5, ("t", 1): 0.3, ("t", 2): 0.05, ("t", 3): 0.1}  # 0.85 against 0.1
    # 0.3 first (nearest half the 0.75 gap), then 0.05 evens out what is left (0.55 against 0.4).
    assert balance_by_load(assignment, loads, [0, 1], max_moves=10) == [Move(("t", 1), 0, 1), Move(("t", 2), 0, 1)]


def test_balance_by_load_leaves_equal_loads_and_gaps_within_tolerance_alone() -> None:
    assignment = parts(0, 1, 2, 0, 1, 2)
    assert balance_by_load(assignment, dict.fromkeys(assignment, 0.2), [0, 1, 2], max_moves=10) == []
    # 0.42, 0.40 and 0.38: moving the 0.02 item would even it out, but the gap is within the tolerance (0.05).
    jitter = {**dict.fromkeys(assignment, 0.2), ("t", 5): 0.18, ("t", 6): 0.02}
    assert balance_by_load({**assignment, ("t", 6): 0}, jitter, [0, 1, 2], max_moves=10) == []
    assert balance_by_load({**assignment, ("t", 6): 0}, jitter, [0, 1, 2], max_moves=10, tolerance=0.01) == [
        Move(("t", 6), 0, 2)]
    assert balance_by_load(assignment, {}, [0, 1, 2], max_moves=10) == []  # no load reported: nothing to go by


def test_balance_by_load_makes_at_most_max_moves() -> None:
    assignment = parts(*[0] * 8)
    loads = dict.fromkeys(assignment, 0.1)
    assert len(balance_by_load(assignment, loads, [0, 1, 2, 3], max_moves=2)) == 2
    assert len(balance_by_load(assignment, loads, [0, 1, 2, 3], max_moves=10)) == 6
    assert balance_by_load(assignment, loads, [0, 1, 2, 3], max_moves=0) == []


def test_balance_by_load_moves_items_of_unknown_shards_hottest_first_to_the_least_loaded() -> None:
    assignment = parts(0, 9, 9, 1)
    loads = {("t", 0): 0.4, ("t", 1): 0.5, ("t", 2): 0.1, ("t", 3): 0.2}
    moves = balance_by_load(assignment, loads, [0, 1], max_moves=10)
    assert moves[:2] == [Move(("t", 1), 9, 1), Move(("t", 2), 9, 0)]
    assert set(apply(assignment, moves).values()) <= {0, 1}


@given(st.lists(st.tuples(st.integers(0, 4), st.floats(0, 1)), max_size=40),
       st.lists(st.integers(0, 4), min_size=1, max_size=5, unique=True), st.integers(0, 50))
def test_balance_by_load_never_makes_the_hottest_shard_hotter(
        placed: list[tuple[int, float]], shards: list[int], max_moves: int) -> None:
    assignment = {("t", p): shards[s % len(shards)] for p, (s, _) in enumerate(placed)}
    loads = {("t", p): busy for p, (_, busy) in enumerate(placed)}
    moves = balance_by_load(assignment, loads, shards, max_moves)
    assert len(moves) <= max_moves and len({m.item for m in moves}) == len(moves)
    before = shard_loads(assignment, loads, shards)
    current = dict(before)
    for m in moves:  # each move leaves its target cooler than its source was
        assert assignment[m.item] == m.source != m.target  # type: ignore[index]
        assert current[m.target] + loads[m.item] < current[m.source]  # type: ignore[index]
        current[m.source] -= loads[m.item]  # type: ignore[index]
        current[m.target] += loads[m.item]  # type: ignore[index]
    assert max(shard_loads(apply(assignment, moves), loads, shards).values()) <= max(before.values()) + 1e-9


def test_balance_by_load_is_deterministic_whatever_the_order_of_its_inputs() -> None:
    assignment = parts(0, 0, 0, 1, 1, 7)
    loads = {("t", 0): 0.3, ("t", 1): 0.3, ("t", 2): 0.2, ("t", 3): 0.2, ("t", 4): 0.1, ("t", 5): 0.3}
    first = balance_by_load(assignment, loads, [0, 1, 2], max_moves=10)
    reordered = balance_by_load(dict(reversed(assignment.items())), dict(reversed(loads.items())), [2, 1, 0], 10)
    assert first == reordered and first == balance_by_load(assignment, loads, [0, 1, 2], max_moves=10)
    assert first  # there was something to do


def test_pick_to_drain_takes_the_least_loaded_then_the_fewest_items_then_the_highest_id() -> None:
    assert pick_to_drain({0: 0.5, 1: 0.1, 2: 0.3}, {0: [1], 1: [1, 2, 3], 2: []}) == 1
    assert pick_to_drain({0: 0.1, 1: 0.1, 2: 0.3}, {0: [1], 1: [1, 2], 2: []}) == 0
    assert pick_to_drain({0: 0.0, 1: 0.0, 2: 0.0}, {}) == 2
    with pytest.raises(ValueError, match="no shard to drain"):
        pick_to_drain({}, {})


def test_pick_to_drain_empties_a_node_first_and_the_controllers_node_last() -> None:
    loads = {0: 0.0, 1: 0.3, 2: 0.1, 3: 0.2}
    nodes = {0: "head", 1: "w1", 2: "w2", 3: "w2"}
    # Shard 1 is alone on w1: draining it lets Ray's autoscaler release w1, though shard 0 is idler.
    assert pick_to_drain(loads, {}, nodes, home_node="head") == 1
    # Only the head's shard is alone: the least loaded of w2's two goes; the head's shard only when it is the last.
    assert pick_to_drain({s: b for s, b in loads.items() if s != 1}, {}, nodes, home_node="head") == 2
    assert pick_to_drain({0: 0.0}, {}, nodes, home_node="head") == 0


def test_every_node_gets_its_shards_at_distinct_port_slots_of_a_shared_address() -> None:
    plan = plan_shards([Node("a", "127.0.0.1", 2), Node("b", "127.0.0.1", 1)], {})
    assert plan.keep == {} and plan.forget == []
    assert sorted(slot for _, _, slot in plan.new) == [0, 1, 2]
    on_hosts = plan_shards([Node("a", "10.0.0.1", 2), Node("b", "10.0.0.2", 2)], {})
    assert sorted((ip, slot) for _, ip, slot in on_hosts.new) == [("10.0.0.1", 0), ("10.0.0.1", 1),
                                                                  ("10.0.0.2", 0), ("10.0.0.2", 1)]



def test_new_shards_avoid_the_port_slots_found_taken_on_their_address() -> None:
    plan = plan_shards([Node("a", "10.0.0.1", 2), Node("b", "10.0.0.2", 1)], {}, {"10.0.0.1": {0, 2}})
    assert sorted((ip, slot) for _, ip, slot in plan.new) == [("10.0.0.1", 1), ("10.0.0.1", 3), ("10.0.0.2", 0)]
    assert free_slot({0, 1, 3}) == 2 and free_slot(set()) == 0


def test_a_restarted_cluster_on_the_same_hosts_keeps_its_shard_ids() -> None:
    wanted = {0: ("old-a", "10.0.0.1", 0), 1: ("old-a", "10.0.0.1", 1), 2: ("old-b", "10.0.0.2", 0)}
    plan = plan_shards([Node("new-a", "10.0.0.1", 2), Node("new-b", "10.0.0.2", 1)], wanted)
    assert plan.keep == {0: "new-a", 1: "new-a", 2: "new-b"}
    assert plan.new == [] and plan.forget == []


def test_shards_of_a_lost_node_are_forgotten_and_a_new_node_gets_new_ones() -> None:
    wanted = {0: ("a", "10.0.0.1", 0), 1: ("b", "10.0.0.2", 0)}
    plan = plan_shards([Node("a", "10.0.0.1", 1), Node("c", "10.0.0.3", 1)], wanted)
    assert plan.keep == {0: "a"} and plan.forget == [1] and plan.new == [("c", "10.0.0.3", 0)]


def test_a_node_asked_for_fewer_shards_gives_up_its_highest_ids() -> None:
    wanted = {0: ("a", "10.0.0.1", 0), 1: ("a", "10.0.0.1", 1), 2: ("a", "10.0.0.1", 2)}
    plan = plan_shards([Node("a", "10.0.0.1", 1)], wanted)
    assert plan.keep == {0: "a"} and plan.forget == [1, 2]


def test_placement_reads_leaders_epochs_and_group_slots_from_data() -> None:
    info = TopicInfo("t", uuid.uuid4(), 3, [4, 7, 4], leader_epochs=[0, 2, 1])
    shards = [ShardAddress(4, "h", 1), ShardAddress(7, "h", 2)]
    p = Placement(4, shards, group_slots=[7] * GROUP_SLOTS)
    assert [p.leader_of(info, i) for i in range(3)] == [4, 7, 4]
    assert [p.leader_epoch(info, i) for i in range(3)] == [0, 2, 1]
    assert [p.leads(info, i) for i in range(3)] == [True, False, True]
    assert p.coordinator_of("any-group") == 7 and not p.coordinates("any-group")
    assert not p.live(9) and p.live(7)
    moved = info.moved(1, 4)
    assert (moved.placement, moved.leader_epochs) == ([4, 4, 4], [0, 3, 1])
    lone = Placement(0, lone=True)
    assert lone.leads(info, 1) and lone.coordinates("any-group") and lone.leader_of(info, 1) == 0


def test_new_partitions_avoid_drained_shards_unless_every_shard_is_drained() -> None:
    p = Placement(0, [ShardAddress(i, "h", 9092 + i) for i in range(3)])
    p.draining = {1}
    assert p.accepting_ids() == [0, 2]
    p.draining = {0, 1, 2}
    assert p.accepting_ids() == [0, 1, 2]


def test_new_topics_spread_over_the_live_shard_ids_and_groups_over_all_slots() -> None:
    assert sorted(Counter(spread("t", 9, [3, 8, 11])).items()) == [(3, 3), (8, 3), (11, 3)]
    assert {group_slot(f"g{i}") for i in range(2000)} == set(range(GROUP_SLOTS))
