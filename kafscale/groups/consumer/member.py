"""One member of a consumer-protocol group, and how it moves towards its target assignment (Kafka's
CurrentAssignmentBuilder): partitions it must give up are revoked first, at its current epoch; only once it says
they are gone does it take the new epoch, and with it the partitions no other member still owns."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kafscale.groups.consumer.assignors import Assignment

NEVER = float("inf")
LEFT_STATIC = -2  # a static member that left, keeping its assignment for its session, to come back to


class MemberState(enum.Enum):
    STABLE = "stable"  # has its whole target
    UNREVOKED_PARTITIONS = "unrevoked_partitions"  # must first give up partitions it owns
    UNRELEASED_PARTITIONS = "unreleased_partitions"  # waits for partitions other members still own


@dataclass(slots=True)
class ConsumerMember:
    member_id: str
    client_id: str = ""
    client_host: str = ""
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = 0
    subscribed_names: tuple[str, ...] = ()
    subscribed_regex: str | None = None
    server_assignor: str | None = None
    epoch: int = 0
    previous_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: Assignment = field(default_factory=dict)  # owned, and may be used
    revoking: Assignment = field(default_factory=dict)  # owned, to be given up
    # KIP-1251: the member epoch at which each owned partition was assigned. A commit at an older epoch than the
    # member's is accepted for partitions it had by then. As Kafka 4.4 keeps it (checked side by side): an epoch
    # bump that leaves the member's partitions as they were keeps their epochs; any change of them (a revocation,
    # an addition) stamps them all with the new epoch.
    assigned_at: dict[tuple[str, int], int] = field(default_factory=dict)
    session_deadline: float = NEVER
    revoke_deadline: float = NEVER  # while UNREVOKED_PARTITIONS: fenced past it
    # Whether the member has shown (its owned partitions in a heartbeat) that it has its current assignment; until
    # then every answer repeats the assignment, in case the answer that carried it was lost.
    acknowledged: bool = False

    def owned(self) -> set[tuple[str, int]]:
        return {(t, p) for a in (self.assigned, self.revoking) for t, ps in a.items() for p in ps}

    def may_commit_at(self, epoch: int, topic: str, partition: int) -> bool:
        """KIP-1251: whether a commit at `epoch` (at most the member's) may write this partition: the member still
        owns it, and owned it at that epoch."""
        assigned_at = self.assigned_at.get((topic, partition))
        return assigned_at is not None and assigned_at <= epoch


def partitions_of(assignment: Mapping[str, frozenset[int]]) -> set[tuple[str, int]]:
    return {(t, p) for t, ps in assignment.items() for p in ps}


def reported_subset(reported: Assignment | None, assigned: Assignment) -> bool:
    """Whether the partitions a member says it owns are all among those it is assigned (None: it did not say)."""
    return reported is not None and partitions_of(reported) <= partitions_of(assigned)


def reconcile(member: ConsumerMember, target: Assignment, target_epoch: int, reported: Assignment | None,
              owned_by_other: Callable[[str, int], bool], now: float) -> ConsumerMember:
    """The member after one heartbeat: what it may own now, at which epoch, in which state."""
    if member.state is MemberState.UNREVOKED_PARTITIONS:
        if not reported_subset(reported, member.assigned):
            return member  # still revoking: nothing changes until it confirms
    elif member.state is MemberState.STABLE and member.epoch == target_epoch:
        return member
    keep: dict[str, frozenset[int]] = {}
    revoke: dict[str, frozenset[int]] = {}
    take: dict[str, frozenset[int]] = {}
    unreleased = False
    for topic in sorted(set(member.assigned) | set(target)):
        current, wanted = member.assigned.get(topic, frozenset()), target.get(topic, frozenset())
        if current & wanted:
            keep[topic] = current & wanted
        if current - wanted:
            revoke[topic] = current - wanted
        free = frozenset(p for p in wanted - current if not owned_by_other(topic, p))
        unreleased |= len(free) < len(wanted - current)
        if keep.get(topic) or free:
            take[topic] = keep.get(topic, frozenset()) | free
    if revoke:
        return dataclasses.replace(member, state=MemberState.UNREVOKED_PARTITIONS, assigned=keep, revoking=revoke,
                                   revoke_deadline=now + member.rebalance_timeout_ms / 1000)
    state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
    previous = member.previous_epoch if member.epoch == target_epoch else member.epoch
    unchanged = not member.revoking and take == member.assigned
    assigned_at = member.assigned_at if unchanged else {(t, p): target_epoch for t, ps in take.items() for p in ps}
    return dataclasses.replace(member, state=state, epoch=target_epoch, previous_epoch=previous, assigned=take,
                               revoking={}, revoke_deadline=NEVER, assigned_at=assigned_at)
