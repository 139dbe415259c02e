"""The consumer-protocol group's state machine (kafscale/groups/consumer/), with explicit time and no I/O: joins,
incremental reconciliation through member epochs (a partition is never owned by two members), leaves, session
and revocation timeouts, static members, regex subscriptions, the request checks and the offset checks."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from kafscale.cluster import keys
from kafscale.groups.consumer.assignors import range_, uniform
from kafscale.groups.consumer.group import (
    ConsumerGroup,
    ConsumerSettings,
    Heartbeat,
    HeartbeatAnswer,
)
from kafscale.groups.consumer.member import MemberState
from kafscale.groups.consumer.stored import consumer_group_records, load_consumer_group
from kafscale.protocol.errors import INVALID_REGULAR_EXPRESSION

SETTINGS = ConsumerSettings(session_timeout_ms=10_000, heartbeat_interval_ms=1_000)
TOPICS = {"t": 6, "u": 2, "other": 3}


def join(group: ConsumerGroup, member: str, now: float = 0.0, topics: tuple[str, ...] = ("t",),
         **extra: object) -> HeartbeatAnswer:
    hb = Heartbeat(member_id=member, member_epoch=0, rebalance_timeout_ms=5_000, subscribed_names=topics, owned={},
                   **extra)  # type: ignore[arg-type]
    return group.heartbeat(now, hb, TOPICS, 1)


def beat(group: ConsumerGroup, member: str, epoch: int, owned: dict[str, frozenset[int]] | None,
         now: float = 0.0) -> HeartbeatAnswer:
    return group.heartbeat(now, Heartbeat(member_id=member, member_epoch=epoch, owned=owned), TOPICS, 1)


def parts(answer: HeartbeatAnswer) -> set[tuple[str, int]]:
    assert answer.assignment is not None
    return {(t, p) for t, ps in answer.assignment.items() for p in ps}


def owners(group: ConsumerGroup) -> dict[tuple[str, int], list[str]]:
    """Every partition some member owns (assigned or still revoking), with its owners."""
    found: dict[tuple[str, int], list[str]] = {}
    for m in group.members.values():
        for tp in m.owned():
            found.setdefault(tp, []).append(m.member_id)
    return found


def as_owned(tps: set[tuple[str, int]]) -> dict[str, frozenset[int]]:
    out: dict[str, set[int]] = {}
    for t, p in tps:
        out.setdefault(t, set()).add(p)
    return {t: frozenset(ps) for t, ps in out.items()}


def test_a_lone_member_gets_every_partition_of_its_topics() -> None:
    g = ConsumerGroup("g", SETTINGS, 0)
    a = join(g, "a")
    assert a.error == ErrorCode.none and a.member_id == "a"
    assert a.member_epoch == g.epoch == g.assignment_epoch
    assert parts(a) == {("t", p) for p in range(6)}
    assert a.heartbeat_interval_ms == 1_000
    assert g.state_name == "Stable"


def test_a_second_member_gets_partitions_only_after_the_first_revoked_them() -> None:
    g = ConsumerGroup("g", SETTINGS, 0)
    a = join(g, "a")
    b = join(g, "b", 1)
    assert b.member_epoch == g.assignment_epoch
    assert b.assignment == {}  # its target is still owned by a
    assert g.members["b"].state is MemberState.UNRELEASED_PARTITIONS
    assert g.state_name == "Reconciling"
    # a learns what to give up, at its old epoch
    a2 = beat(g, "a", a.member_epoch, as_owned(parts(a)), 2)
    assert a2.member_epoch == a.member_epoch
    kept = parts(a2)
    assert len(kept) == 3 and g.members["a"].state is MemberState.UNREVOKED_PARTITIONS
    assert all(len(o) == 1 for o in owners(g).values())
    # b asks again while a has not confirmed: still nothing
    assert beat(g, "b", b.member_epoch, {}, 3).assignment is None
    # a confirms: it takes the new epoch; b then gets the released partitions
    a3 = beat(g, "a", a2.member_epoch, as_owned(kept), 4)
    assert a3.member_epoch == g.assignment_epoch
    b2 = beat(g, "b", b.member_epoch, {}, 5)
    assert parts(b2) == {("t", p) for p in range(6)} - kept
    assert all(len(o) == 1 for o in owners(g).values())
    assert g.state_name == "Stable"


def test_a_leaving_member_hands_its_partitions_to_the_others() -> None:
    g = ConsumerGroup("g", SETTINGS, 0)
    join(g, "a")
    b = join(g, "b")
    beat(g, "a", g.members["a"].epoch, as_owned({("t", p) for p in range(6)}))
    beat(g, "a", g.members["a"].epoch, g.members["a"].assigned)  # revoked what it was told to
    b = beat(g, "b", b.member_epoch, {})
    left = g.heartbeat(1, Heartbeat(member_id="b", member_epoch=-1), TOPICS, 1)
    assert left.error == ErrorCode.none and left.member_epoch == -1
    assert "b" not in g.members
    a = beat(g, "a", g.members["a"].epoch, None, 2)
    assert parts(a) == {("t", p) for p in range(6)}


def test_a_member_whose_session_ends_is_removed_and_its_partitions_freed() -> None:
    g = ConsumerGroup("g", SETTINGS, 0)
    join(g, "a")
    join(g, "b", 5)
    assert g.next_deadline() == 10.0  # a's session: its last heartbeat at 0
    g.expire(10.0)
    assert set(g.members) == {"b"} and g.store_requested
    b = beat(g, "b", g.members["b"].epoch, {}, 11)
    assert parts(b) == {("t", p) for p in range(6)}


def test_a_member_that_does_not_revoke_in_its_rebalance_timeout_is_fenced() -> None:
    g = ConsumerGroup("g", SETTINGS, 0)
    a = join(g, "a")
    join(g, "b", 1)
    beat(g, "a", a.member_epoch, as_owned(parts(a)), 2)  # told to revoke, rebalance timeout 5 s
    assert g.members["a"].revoke_deadline == 7.0
    beat(g, "a", a.member_epoch, as_owned(parts(a)), 6)  # still owns them all
    g.expire(7.0)
    assert "a" not in g.members
    b = beat(g, "b", g.members["b"].epoch, {}, 8)
    assert parts(b) == {("t", p) for p in range(6)}


def test_epochs_are_checked_a_lost_answer_is_forgiven() -> None:
    g = ConsumerGroup("g", SETTINGS, 0)
    a = join(g, "a")
    assert beat(g, "a", a.member_epoch + 1, None).error == ErrorCode.fenced_member_epoch
    join(g, "b")
    a_owned = as_owned(parts(a))
    a2 = beat(g, "a", a.member_epoch, a_owned)
    a3 = beat(g, "a", a2.member_epoch, as_owned(parts(a2)))
    assert a3.member_epoch > a.member_epoch
    # the answer carrying the new epoch was lost: the previous epoch with owned partitions it still has is fine
    assert beat(g, "a", a.member_epoch, as_owned(parts(a2))).error == ErrorCode.none
    # but not with partitions it was told to give up
    assert beat(g, "a", a.member_epoch, a_owned).error == ErrorCode.fenced_member_epoch
    assert beat(g, "nobody", 3, None).error == ErrorCode.unknown_member_id


@pytest.mark.parametrize(("hb", "message"), [
    (Heartbeat(member_id="a", member_epoch=0, subscribed_names=("t",), owned={}), "RebalanceTimeoutMs"),
    (Heartbeat(member_id="a", member_epoch=0, rebalance_timeout_ms=1, owned={}), "SubscribedTopicNames"),
    (Heartbeat(member_id="a", member_epoch=0, rebalance_timeout_ms=1, subscribed_names=("t",)), "TopicPartitions"),
    (Heartbeat(member_id="", member_epoch=0, rebalance_timeout_ms=1, subscribed_names=("t",), owned={}), "MemberId"),
    (Heartbeat(member_id="a", member_epoch=-3), "MemberEpoch"),
])
def test_malformed_heartbeats_get_invalid_request_naming_the_field(hb: Heartbeat, message: str) -> None:
    answer = ConsumerGroup("g", SETTINGS, 0).heartbeat(0, hb, TOPICS, 1)
    assert answer.error == ErrorCode.invalid_request and message in (answer.message or "")


def test_v0_joins_without_a_member_id_get_one() -> None:
    g = ConsumerGroup("g", SETTINGS, 0)
    answer = g.heartbeat(0, Heartbeat(member_id="", member_epoch=0, rebalance_timeout_ms=1, subscribed_names=("t",),
                                      owned={}), TOPICS, 0)
    assert answer.error == ErrorCode.none and answer.member_id and answer.member_id in g.members


def test_unknown_assignor_and_bad_regex_are_refused() -> None:
    g = ConsumerGroup("g", SETTINGS, 0)
    answer = join(g, "a", server_assignor="sticky")
    assert answer.error == ErrorCode.unsupported_assignor and "uniform, range" in (answer.message or "")
    answer = join(g, "a", topics=(), subscribed_regex="t[")
    assert answer.error == INVALID_REGULAR_EXPRESSION
    assert g.members == {}


def test_a_regex_subscription_matches_topics_and_follows_new_ones() -> None:
    g = ConsumerGroup("g", SETTINGS, 0)
    a = g.heartbeat(0, Heartbeat(member_id="a", member_epoch=0, rebalance_timeout_ms=1, subscribed_regex="t|u",
                                 owned={}), TOPICS, 1)
    assert parts(a) == {("t", p) for p in range(6)} | {("u", 0), ("u", 1)}
    grown = {**TOPICS, "u": 3}  # a partition added: a new epoch, and the member gets it
    a2 = g.heartbeat(1, Heartbeat(member_id="a", member_epoch=a.member_epoch, owned=a.assignment), grown, 1)
    assert a2.member_epoch > a.member_epoch and ("u", 2) in parts(a2)


def test_the_assignor_most_members_name_is_used() -> None:
    g = ConsumerGroup("g", SETTINGS, 0)
    join(g, "a", server_assignor="range")
    assert g.assignor == "range"
    join(g, "b")
    assert g.assignor == "range"


def test_a_static_member_that_left_temporarily_gets_its_partitions_back_under_a_new_id() -> None:
    g = ConsumerGroup("g", SETTINGS, 0)
    a = join(g, "a", instance_id="host-1")
    left = g.heartbeat(1, Heartbeat(member_id="a", member_epoch=-2, instance_id="host-1"), TOPICS, 1)
    assert left.member_epoch == -2 and g.members["a"].epoch == -2
    # the instance id is held while another member claims it
    taken = join(g, "x", 2, instance_id="host-1")
    assert taken.error == ErrorCode.none  # host-1 left temporarily: x takes its place
    assert "a" not in g.members and parts(taken) == parts(a)
    assert join(g, "y", 3, instance_id="host-1").error == ErrorCode.unreleased_instance_id


def commit(g: ConsumerGroup, member: str, epoch: int, tp: tuple[str, int] = ("t", 0), api_version: int = 9,
           transactional: bool = False) -> ErrorCode:
    return g.check_commit(member, epoch, api_version=api_version, transactional=transactional).partition_error(*tp)


def test_offset_commits_and_fetches_are_checked_against_member_epochs() -> None:
    g = ConsumerGroup("g", SETTINGS, 0)
    assert commit(g, "", -1) == ErrorCode.none  # empty: admin commits
    a = join(g, "a")
    assert commit(g, "", -1) == ErrorCode.unknown_member_id
    assert commit(g, "a", a.member_epoch) == ErrorCode.none
    assert commit(g, "a", a.member_epoch + 1) == ErrorCode.stale_member_epoch
    assert commit(g, "a", a.member_epoch - 1) == ErrorCode.stale_member_epoch  # it owned nothing before
    assert commit(g, "a", a.member_epoch, api_version=8) == ErrorCode.unsupported_version
    assert commit(g, "a", a.member_epoch, api_version=3, transactional=True) == ErrorCode.none
    assert g.check_fetch(None, -1) == ErrorCode.none
    assert g.check_fetch("a", a.member_epoch) == ErrorCode.none
    assert g.check_fetch("a", 0) == ErrorCode.stale_member_epoch
    assert g.check_fetch("b", 1) == ErrorCode.unknown_member_id


def test_a_commit_at_an_older_epoch_writes_what_the_member_owned_since_then() -> None:
    """KIP-1251 (Kafka 4.3), as Kafka 4.4 answers it (tests/differential/test_consumer_groups.py): a heartbeat bumps
    a member's epoch before the member hears of it. An epoch bump that left its partitions as they were accepts its
    commits at the epoch before; once its partitions change, only commits from the epoch of the change on."""
    g = ConsumerGroup("g", SETTINGS, 0)
    a = join(g, "a")
    first = a.member_epoch
    beat(g, "a", first, as_owned(parts(a)))
    join(g, "c", topics=("u",))  # another topic: a's partitions stay, its epoch moves on
    beat(g, "a", first, as_owned(parts(a)))
    bumped = g.members["a"].epoch
    assert bumped > first and g.members["a"].assigned == {"t": frozenset(range(6))}
    assert commit(g, "a", first, ("t", 0)) == ErrorCode.none
    assert commit(g, "a", bumped, ("t", 0)) == ErrorCode.none
    assert commit(g, "a", bumped + 1, ("t", 0)) == ErrorCode.stale_member_epoch  # an epoch it never had
    assert commit(g, "a", first, ("u", 0)) == ErrorCode.stale_member_epoch  # c's, never a's

    join(g, "b")  # a must give up half of t
    revoking = beat(g, "a", bumped, as_owned(parts(a)))
    kept = parts(revoking)
    given_up = parts(a) - kept
    assert commit(g, "a", first, next(iter(given_up))) == ErrorCode.none  # still a's until it confirms
    beat(g, "a", bumped, as_owned(kept))  # revoked: a takes the new epoch with a changed set
    changed = g.members["a"].epoch
    for tp in kept:
        assert commit(g, "a", bumped, tp) == ErrorCode.stale_member_epoch
        assert commit(g, "a", changed, tp) == ErrorCode.none
    for tp in given_up:
        assert commit(g, "a", changed, tp) == ErrorCode.none  # at its current epoch, any partition (as Kafka)
        assert commit(g, "a", bumped, tp) == ErrorCode.stale_member_epoch


def stored_group() -> ConsumerGroup:
    g = ConsumerGroup("g", SETTINGS, 0)
    a = join(g, "a", instance_id="i")
    join(g, "b", topics=("t", "u"), server_assignor="range")
    beat(g, "a", a.member_epoch, as_owned(parts(a)))
    return g


def test_the_stored_group_loads_back_the_same() -> None:
    g = stored_group()
    records = consumer_group_records(g)
    header = records.pop(keys.group("g"))
    assert sorted(records) == [keys.group_member("g", "a"), keys.group_member("g", "b")]  # one record per member
    loaded = load_consumer_group("g", header, list(records.values()), SETTINGS, 100.0)
    assert consumer_group_records(loaded) == {keys.group("g"): header, **records}
    assert loaded.target == g.target
    assert loaded.members["a"].state is g.members["a"].state
    assert loaded.members["a"].session_deadline == 110.0
    assert loaded.static_members == {"i": "a"}
    assert loaded.members["a"].assigned_at == g.members["a"].assigned_at != {}


def test_a_group_stored_whole_in_one_record_still_loads() -> None:
    g = stored_group()
    records = consumer_group_records(g)
    header = records.pop(keys.group("g"))
    members = [{k: v for k, v in m.items() if k != "target"} for m in records.values()]
    old = {**header, "members": members, "target": {m["id"]: m["target"] for m in records.values()}}
    loaded = load_consumer_group("g", old, [], SETTINGS, 100.0)
    assert consumer_group_records(loaded) == {keys.group("g"): header, **records}


def test_uniform_is_balanced_and_sticky() -> None:
    subs = {m: frozenset({"t"}) for m in "abc"}
    first = uniform(subs, {"t": 8}, {})
    assert sorted(len(a["t"]) for a in first.values()) == [2, 3, 3]
    more = {**subs, "d": frozenset({"t"})}
    second = uniform(more, {"t": 8}, first)
    assert sorted(len(a.get("t", ())) for a in second.values()) == [2, 2, 2, 2]
    moved = sum(len(second[m]["t"] - first[m]["t"]) for m in "abc")
    assert moved == 0  # the old members only gave partitions up
    # members subscribing to different topics each get only theirs
    mixed = uniform({"a": frozenset({"t"}), "b": frozenset({"u"})}, {"t": 3, "u": 2}, {})
    assert mixed == {"a": {"t": frozenset({0, 1, 2})}, "b": {"u": frozenset({0, 1})}}


def test_range_gives_each_member_consecutive_partitions_of_each_topic() -> None:
    subs = {m: frozenset({"t", "u"}) for m in "ab"}
    assert range_(subs, {"t": 5, "u": 2}, {}) == {"a": {"t": frozenset({0, 1, 2}), "u": frozenset({0})},
                                                  "b": {"t": frozenset({3, 4}), "u": frozenset({1})}}


def test_a_member_that_lost_the_answer_carrying_its_assignment_gets_it_again() -> None:
    """The answer giving a its new epoch and fewer partitions was lost; its client resends the heartbeat it timed
    out on (previous epoch, the partitions it still has). The answer repeats the assignment, or a would keep
    partitions the group believes it gave up."""
    g = ConsumerGroup("g", SETTINGS, 0)
    a = join(g, "a")
    join(g, "b")
    told = beat(g, "a", a.member_epoch, as_owned(parts(a)))  # told to revoke: this answer arrives
    confirmed = beat(g, "a", told.member_epoch, as_owned(parts(told)))  # confirmation: new epoch, same partitions
    assert confirmed.member_epoch > a.member_epoch
    assert confirmed.assignment is None  # nothing changed in what it owns: nothing to repeat
    # Lost: a resends a heartbeat at the previous epoch, still owning every partition.
    again = beat(g, "a", told.member_epoch, as_owned(parts(a)))
    assert again.error == ErrorCode.fenced_member_epoch  # it owns what it was told to give up: Kafka fences it
    resent = beat(g, "a", told.member_epoch, as_owned(parts(told)))
    assert resent.error == ErrorCode.none and resent.assignment is None  # owns what it is assigned
    drifted = beat(g, "a", confirmed.member_epoch, as_owned({("t", 0)}))  # says it owns less than assigned
    assert drifted.assignment is not None and parts(drifted) == parts(told)


def test_the_assignment_is_repeated_until_the_member_shows_it_has_it() -> None:
    """The answer carrying a's smaller assignment is lost; its client's next heartbeats say nothing of what it owns
    (nothing changed on its side). Every answer repeats the assignment until a heartbeat shows a owns exactly it."""
    g = ConsumerGroup("g", SETTINGS, 0)
    a = join(g, "a")
    assert beat(g, "a", a.member_epoch, as_owned(parts(a))).assignment is None  # acknowledged: nothing to repeat
    join(g, "b")
    lost = beat(g, "a", a.member_epoch, None)  # told to revoke: this answer is lost
    assert lost.assignment is not None
    again = beat(g, "a", a.member_epoch, None)
    assert again.assignment == lost.assignment
    confirmed = beat(g, "a", a.member_epoch, lost.assignment)  # it revoked: shows it owns exactly that
    assert confirmed.assignment is None and confirmed.member_epoch == g.assignment_epoch
