"""The state machine of one consumer-protocol group (KIP-848), without I/O and with explicit time.

A heartbeat moves everything: the member's subscription is updated; the group epoch is bumped when members or
what they subscribe to change; a bumped epoch gets a new target assignment from the assignor; the member then
reconciles towards its target (member.py). Members are removed when their session ends, when they do not revoke in
their rebalance timeout, or when they leave. The coordinator (coordinator.py) stores the group after a heartbeat
that changed it (`store_requested`) and answers only then.

The group exposes the few things the coordinator and offsets code ask of any group (state, protocol_type,
next_deadline, expire, check_commit, subscribed_topics...), so one coordinator hosts either protocol's groups.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from kafscale.groups.consumer.assignors import ASSIGNORS, Assignment
from kafscale.groups.consumer.member import (
    LEFT_STATIC,
    NEVER,
    ConsumerMember,
    MemberState,
    partitions_of,
    reconcile,
    reported_subset,
)
from kafscale.groups.members import CONSUMER_PROTOCOL, State
from kafscale.protocol.errors import INVALID_REGULAR_EXPRESSION

LEAVE = -1


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 5_000
    assignors: tuple[str, ...] = ("uniform", "range")
    max_size: int = 2_147_483_647


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A ConsumerGroupHeartbeat request, with topic ids already turned into names (None: not sent)."""
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_names: tuple[str, ...] | None = None
    subscribed_regex: str | None = None
    server_assignor: str | None = None
    owned: Assignment | None = None
    client_id: str = ""
    client_host: str = ""


@dataclass(frozen=True, slots=True)
class CommitCheck:
    """What an offset commit may write: nothing (`error`), everything, or, at an epoch older than its member's
    (KIP-1251), the partitions the member owned by that epoch and still owns; the others get STALE_MEMBER_EPOCH. A
    heartbeat bumps a member's epoch before the member hears of it, and its commits in between are not stale."""
    error: ErrorCode
    member: ConsumerMember | None = None
    epoch: int = 0

    def partition_error(self, topic: str, partition: int) -> ErrorCode:
        if self.error != ErrorCode.none or self.member is None:
            return self.error
        return ErrorCode.none if self.member.may_commit_at(self.epoch, topic, partition) \
            else ErrorCode.stale_member_epoch


@dataclass(frozen=True, slots=True)
class HeartbeatAnswer:
    error: int
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = -1
    heartbeat_interval_ms: int = 0
    assignment: Assignment | None = None  # None: unchanged since the member last heard it


class ConsumerGroup:
    protocol_type = CONSUMER_PROTOCOL
    group_type = "consumer"

    def __init__(self, group_id: str, settings: ConsumerSettings, now: float) -> None:
        self.group_id = group_id
        self.settings = settings
        self.members: dict[str, ConsumerMember] = {}
        self.static_members: dict[str, str] = {}  # instance id -> member id
        # The group epoch: bumped once by a heartbeat that changes members, subscriptions or the subscribed
        # topics. A new group starts at 1, so its first member gets epoch 2, as Kafka 4.4 answers it.
        self.epoch = 1
        self.assignment_epoch = 0  # the epoch the target assignment was computed at
        self.target: dict[str, Assignment] = {}
        self.subscribed: dict[str, int] = {}  # subscribed topics -> partitions, as of the last epoch
        self.assignor = settings.assignors[0]
        self.state_since = now
        self.dead = False
        self.store_requested = False
        # This heartbeat changed the members or what they subscribe to. A change of the subscribed topics'
        # partitions is a bump of its own, as in Kafka (a group's first member takes it to epoch 2).
        self._changed = False
        # What the coordinator asks of classic groups too; never set here.
        self.replies: list[object] = []
        self.pending_assignment = None
        self.pending_members: dict[str, float] = {}

    # ---------------------------------------------------------------- what any group answers

    @property
    def generation(self) -> int:
        return self.epoch

    @property
    def state(self) -> State:
        if self.dead:
            return State.DEAD
        return State.STABLE if self.members else State.EMPTY

    @property
    def state_name(self) -> str:
        """Kafka's ConsumerGroupState: Empty, Assigning, Reconciling, Stable, Dead."""
        if self.dead:
            return "Dead"
        if not self.members:
            return "Empty"
        if self.epoch > self.assignment_epoch:
            return "Assigning"
        if any(m.epoch != self.assignment_epoch or m.state is not MemberState.STABLE
               for m in self.members.values() if m.epoch != LEFT_STATIC):
            return "Reconciling"
        return "Stable"

    @property
    def protocol_name(self) -> str:
        return self.assignor

    def mark_dead(self) -> None:
        self.dead = True

    def subscribed_topics(self) -> set[str]:
        return set(self.subscribed)

    def next_deadline(self) -> float:
        return min((min(m.session_deadline, m.revoke_deadline) for m in self.members.values()), default=NEVER)

    def expire(self, now: float) -> None:
        for member in list(self.members.values()):
            if member.session_deadline <= now:
                self._remove(member, now)
            elif member.revoke_deadline <= now:
                self._remove(member, now)  # did not revoke in its rebalance timeout: fenced

    def check_commit(self, member_id: str, member_epoch: int, *, api_version: int,
                     transactional: bool) -> CommitCheck:
        """Kafka's ConsumerGroup.validateOffsetCommit: a commit naming no member goes to an empty group only; a
        member commits through OffsetCommit v9 or later (or in a transaction), at its current epoch or, for the
        partitions it owned by then, an older one (KIP-1251, Kafka 4.3)."""
        if self.dead:
            return CommitCheck(ErrorCode.coordinator_not_available)
        if member_epoch < 0 and not self.members:
            return CommitCheck(ErrorCode.none)
        member = self.members.get(member_id)
        if member is None:
            return CommitCheck(ErrorCode.unknown_member_id)
        if not transactional and api_version < 9:
            return CommitCheck(ErrorCode.unsupported_version)
        if member_epoch > member.epoch or member_epoch < 0:
            return CommitCheck(ErrorCode.stale_member_epoch)
        if member_epoch < member.epoch:
            return CommitCheck(ErrorCode.none, member, member_epoch)
        return CommitCheck(ErrorCode.none)

    def check_fetch(self, member_id: str | None, member_epoch: int) -> ErrorCode:
        """OffsetFetch v9+: an admin (no member) fetches freely; a member only at its current epoch."""
        if member_id is None and member_epoch < 0:
            return ErrorCode.none
        member = self.members.get(member_id or "")
        if member is None:
            return ErrorCode.unknown_member_id
        if member_epoch != member.epoch:
            return ErrorCode.stale_member_epoch
        return ErrorCode.none

    # ---------------------------------------------------------------- the heartbeat

    def heartbeat(self, now: float, hb: Heartbeat, topics: Mapping[str, int], version: int) -> HeartbeatAnswer:
        """`topics`: every topic that exists now and its partition count (regex subscriptions match among them)."""
        if self.dead:
            return HeartbeatAnswer(ErrorCode.coordinator_not_available)
        self._changed = False
        invalid = self._invalid(hb, version)
        if invalid is not None:
            return invalid
        if hb.member_epoch in (LEAVE, LEFT_STATIC):
            return self._leave(now, hb)
        if hb.member_epoch == 0:
            member, error = self._joining(now, hb)
            if error is not None:
                return error
        else:
            found = self.members.get(hb.member_id)
            if found is None or found.epoch == LEFT_STATIC:
                return HeartbeatAnswer(ErrorCode.unknown_member_id,
                                       f"Member {hb.member_id} is not a member of group {self.group_id}.")
            member = found
            fenced = self._fenced(member, hb)
            if fenced is not None:
                return fenced
        before = (member.assigned, member.epoch)
        member = self._update_subscription(member, hb, now)
        self.members[member.member_id] = member  # a joining member counts in the subscriptions and the assignment
        changed, self._changed = self._changed, False
        if self._refresh_subscribed(topics) or changed:  # one bump for all this heartbeat changed (as Kafka)
            self.epoch += 1
        if self.epoch > self.assignment_epoch:
            self._assign(topics)
        member = reconcile(member, self.target.get(member.member_id, {}), self.assignment_epoch, hb.owned,
                           lambda t, p: self._owned_by_other(member.member_id, t, p), now)
        member.session_deadline = now + self.settings.session_timeout_ms / 1000
        self.members[member.member_id] = member
        if (member.assigned, member.epoch) != before or hb.member_epoch == 0:
            self.store_requested = True
        full = hb.rebalance_timeout_ms != -1 and hb.subscribed_names is not None and hb.owned is not None
        # The assignment goes out until the member's heartbeat shows it owns exactly that: an answer that carried it
        # may have been lost (librdkafka times a heartbeat out after one heartbeat interval and sends it again, with
        # nothing it thinks unchanged), and without it the member keeps what it had while the group waits for it.
        if member.assigned != before[0]:
            member.acknowledged = False
        if hb.owned is not None:
            member.acknowledged = partitions_of(hb.owned) == partitions_of(member.assigned)
        send = hb.member_epoch == 0 or full or not member.acknowledged
        return HeartbeatAnswer(ErrorCode.none, None, member.member_id, member.epoch,
                               self.settings.heartbeat_interval_ms, dict(member.assigned) if send else None)

    def _invalid(self, hb: Heartbeat, version: int) -> HeartbeatAnswer | None:
        def bad(message: str) -> HeartbeatAnswer:
            return HeartbeatAnswer(ErrorCode.invalid_request, message)

        if hb.member_epoch < LEFT_STATIC:
            return bad("MemberEpoch is invalid.")
        if (version >= 1 or hb.member_epoch != 0) and not hb.member_id:
            return bad("MemberId can't be empty.")
        if hb.member_epoch == LEFT_STATIC and hb.instance_id is None:
            return bad("InstanceId can't be null.")
        if hb.member_epoch == 0:
            if hb.rebalance_timeout_ms == -1:
                return bad("RebalanceTimeoutMs must be provided in first request.")
            if hb.owned is None or any(hb.owned.values()):
                return bad("TopicPartitions must be empty when (re-)joining.")
            if hb.subscribed_names is None and hb.subscribed_regex is None:
                return bad("SubscribedTopicNames or SubscribedTopicRegex must be set in first request.")
        if hb.server_assignor is not None and hb.server_assignor not in self.settings.assignors:
            return HeartbeatAnswer(ErrorCode.unsupported_assignor,
                                   f"ServerAssignor {hb.server_assignor} is not supported. Supported assignors: "
                                   f"{', '.join(self.settings.assignors)}.")
        if hb.subscribed_regex is not None:
            try:
                re.compile(hb.subscribed_regex)
            except re.error as e:
                return HeartbeatAnswer(INVALID_REGULAR_EXPRESSION,
                                       f"SubscribedTopicRegex `{hb.subscribed_regex}` is not a valid regular "
                                       f"expression: {e}.")
        return None

    def _joining(self, now: float, hb: Heartbeat) -> tuple[ConsumerMember, HeartbeatAnswer | None]:
        member_id = hb.member_id or str(uuid.uuid4())
        if hb.instance_id is not None:
            holder = self.members.get(self.static_members.get(hb.instance_id, ""))
            if holder is not None and holder.member_id != member_id:
                if holder.epoch != LEFT_STATIC:
                    return holder, HeartbeatAnswer(
                        ErrorCode.unreleased_instance_id,
                        f"Static member {member_id} with instance id {hb.instance_id} cannot join the group because "
                        f"the instance id is owned by {holder.member_id} member.")
                # The static member is back under a new id: it takes its predecessor's place and partitions.
                del self.members[holder.member_id]
                replaced = ConsumerMember(member_id=member_id, instance_id=hb.instance_id, epoch=0,
                                          previous_epoch=-1, assigned=holder.assigned,
                                          assigned_at={tp: 0 for tp in partitions_of(holder.assigned)},
                                          subscribed_names=holder.subscribed_names,
                                          subscribed_regex=holder.subscribed_regex,
                                          server_assignor=holder.server_assignor)
                self.target[member_id] = self.target.pop(holder.member_id, {})
                self.static_members[hb.instance_id] = member_id
                return replaced, None
        existing = self.members.get(member_id)
        if existing is None and len(self.members) >= self.settings.max_size:
            return ConsumerMember(member_id), HeartbeatAnswer(
                ErrorCode.group_max_size_reached,
                f"The consumer group has reached its maximum capacity of {self.settings.max_size} members.")
        if existing is not None:  # rejoining (after a fence, or a lost answer): it owns nothing now
            self._release(existing)
        if not self.members:
            self.state_since = now
        if hb.instance_id is not None:
            self.static_members[hb.instance_id] = member_id
        self._changed = True  # a member joins
        return ConsumerMember(member_id=member_id, instance_id=hb.instance_id), None

    def _fenced(self, member: ConsumerMember, hb: Heartbeat) -> HeartbeatAnswer | None:
        if hb.member_epoch > member.epoch:
            return HeartbeatAnswer(ErrorCode.fenced_member_epoch,
                                   f"The consumer group member has a greater member epoch ({hb.member_epoch}) than "
                                   f"the one known by the group coordinator ({member.epoch}). The member must "
                                   f"abandon all its partitions and rejoin.")
        if hb.member_epoch < member.epoch and not (hb.member_epoch == member.previous_epoch
                                                   and reported_subset(hb.owned, member.assigned)):
            return HeartbeatAnswer(ErrorCode.fenced_member_epoch,
                                   f"The consumer group member has a smaller member epoch ({hb.member_epoch}) than "
                                   f"the one known by the group coordinator ({member.epoch}). The member must "
                                   f"abandon all its partitions and rejoin.")
        return None

    def _update_subscription(self, member: ConsumerMember, hb: Heartbeat, now: float) -> ConsumerMember:
        changed = False
        if hb.subscribed_names is not None and tuple(sorted(hb.subscribed_names)) != member.subscribed_names:
            member.subscribed_names, changed = tuple(sorted(hb.subscribed_names)), True
        if hb.subscribed_regex is not None and (hb.subscribed_regex or None) != member.subscribed_regex:
            member.subscribed_regex, changed = hb.subscribed_regex or None, True
        if hb.server_assignor is not None and hb.server_assignor != member.server_assignor:
            member.server_assignor, changed = hb.server_assignor, True
        self._changed |= changed
        if hb.rebalance_timeout_ms != -1:
            member.rebalance_timeout_ms = hb.rebalance_timeout_ms
        for name in ("rack_id", "client_id", "client_host"):
            if (value := getattr(hb, name)) is not None and value != "":
                setattr(member, name, value)
        if changed:
            self.store_requested = True
        return member

    def _leave(self, now: float, hb: Heartbeat) -> HeartbeatAnswer:
        member = self.members.get(hb.member_id)
        if member is None and hb.instance_id is not None:
            member = self.members.get(self.static_members.get(hb.instance_id, ""))
        if member is None:
            return HeartbeatAnswer(ErrorCode.unknown_member_id,
                                   f"Member {hb.member_id} is not a member of group {self.group_id}.")
        if hb.member_epoch == LEFT_STATIC:
            # Keeps its partitions for its session: a static member restarting gets them back without a rebalance.
            member.epoch = LEFT_STATIC
            member.session_deadline = now + self.settings.session_timeout_ms / 1000
            self.store_requested = True
        else:
            self._remove(member, now)
        return HeartbeatAnswer(ErrorCode.none, None, hb.member_id, hb.member_epoch,
                               self.settings.heartbeat_interval_ms)

    def _remove(self, member: ConsumerMember, now: float) -> None:
        self.members.pop(member.member_id, None)
        self.target.pop(member.member_id, None)
        if member.instance_id is not None and self.static_members.get(member.instance_id) == member.member_id:
            del self.static_members[member.instance_id]
        self.epoch += 1
        # Topics only it subscribed to go in the same bump (as Kafka), not in a second one at the next heartbeat.
        still = set().union(*(self.resolved(m, self.subscribed) for m in self.members.values()))
        self.subscribed = {t: n for t, n in self.subscribed.items() if t in still}
        if not self.members:
            self.state_since = now
        self.store_requested = True

    def _release(self, member: ConsumerMember) -> None:
        member.assigned, member.revoking, member.assigned_at = {}, {}, {}

    # ---------------------------------------------------------------- assignment

    def resolved(self, member: ConsumerMember, topics: Mapping[str, int]) -> frozenset[str]:
        """The topics a member subscribes to that exist: its names, and the topics its regex matches fully."""
        found = {t for t in member.subscribed_names if t in topics}
        if member.subscribed_regex:
            pattern = re.compile(member.subscribed_regex)
            found |= {t for t in topics if pattern.fullmatch(t)}
        return frozenset(found)

    def _refresh_subscribed(self, topics: Mapping[str, int]) -> bool:
        """Whether what there is to assign changed (a subscribed topic created, deleted or grown, or a topic newly
        subscribed to): the caller bumps the group epoch."""
        subscribed = {t: topics[t] for m in self.members.values() for t in self.resolved(m, topics)}
        if subscribed == self.subscribed:
            return False
        self.subscribed = subscribed
        self.store_requested = True
        return True

    def _assign(self, topics: Mapping[str, int]) -> None:
        self.assignor = self._preferred_assignor()
        subscriptions = {m.member_id: self.resolved(m, topics) for m in self.members.values()}
        self.target = ASSIGNORS[self.assignor](subscriptions, self.subscribed, self.target)
        self.assignment_epoch = self.epoch
        self.store_requested = True

    def _preferred_assignor(self) -> str:
        """The assignor most members name, the configured default when none does (ties: the first named)."""
        named = [m.server_assignor for m in self.members.values() if m.server_assignor]
        if not named:
            return self.settings.assignors[0]
        return max(sorted(set(named)), key=named.count)

    def _owned_by_other(self, member_id: str, topic: str, partition: int) -> bool:
        return any(other.member_id != member_id and (partition in other.assigned.get(topic, ())
                                                     or partition in other.revoking.get(topic, ()))
                   for other in self.members.values())
