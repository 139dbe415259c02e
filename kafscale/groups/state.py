"""One consumer group's membership state machine (Kafka's classic group protocol), without I/O or clocks.

States: Empty → PreparingRebalance → CompletingRebalance → Stable, back to PreparingRebalance on any membership
change, and Dead once the group is deleted or its coordinator lost it. Kafka's GroupCoordinator and GroupMetadata
are the reference for every rule here; the docstrings name the Kafka behaviour a branch reproduces.

Every method takes `now` (wall-clock seconds) so tests drive time explicitly; nothing here sleeps. A request that
must wait (a JoinGroup at the barrier, a SyncGroup until the leader's assignment is stored) carries a `ticket`; its
answer is appended to `replies` as (ticket, result) once it is ready, and the coordinator (coordinator.py)
hands it to the waiting request. Two things need the store: `pending_assignment` (the leader's assignment must be
durable before any member receives it: the coordinator writes it, then calls `assignment_stored`) and
`store_requested` (membership changed in a way a restarted coordinator must see; written after the call).
"""

from __future__ import annotations

import logging
from collections import Counter

from kio.schema.errors import ErrorCode

from kafscale.groups import joining
from kafscale.groups.members import (
    CONSUMER_PROTOCOL,
    NEVER,
    GroupSettings,
    JoinResult,
    Member,
    State,
    SyncResult,
    subscribed_topics,
)

log = logging.getLogger(__name__)

__all__ = ["CONSUMER_PROTOCOL", "Group", "GroupSettings", "JoinResult", "Member", "State", "SyncResult"]


class Group:
    group_type = "classic"

    def __init__(self, group_id: str, settings: GroupSettings, now: float) -> None:
        self.group_id = group_id
        self.settings = settings
        self.state = State.EMPTY
        self.state_since = now  # offsets of an Empty group expire relative to this
        self.generation = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader: str | None = None
        self.members: dict[str, Member] = {}
        self.static_members: dict[str, str] = {}  # group.instance.id -> member id
        self.pending_members: dict[str, float] = {}  # ids handed out with MEMBER_ID_REQUIRED -> expiry
        self.pending_sync: set[str] = set()  # members of this generation that have not sent SyncGroup yet
        self.join_deadline: float | None = None  # the rebalance barrier gives up waiting here
        self.sync_deadline: float | None = None
        self.initial_delay = False  # the barrier is Kafka's InitialDelayedJoin (group was Empty)
        self.initial_remaining_ms = 0
        self.new_member_added = False
        self.replies: list[tuple[int, JoinResult | SyncResult]] = []
        self.pending_assignment: tuple[int, dict[str, bytes]] | None = None
        self.store_requested = False

    # ------------------------------------------------------------------ queries

    @property
    def state_name(self) -> str:
        return self.state.value

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def all_members_joined(self) -> bool:
        return not self.pending_members and all(m.join_ticket is not None for m in self.members.values())

    def static_error(self, instance_id: str | None, member_id: str) -> ErrorCode:
        """Kafka's check of a group.instance.id a request names: it must be a static member's (else
        UNKNOWN_MEMBER_ID) and that member must be this one (else FENCED_INSTANCE_ID: a newer instance with the
        same group.instance.id replaced it)."""
        if instance_id is None:
            return ErrorCode.none
        current = self.static_members.get(instance_id)
        if current is None:
            return ErrorCode.unknown_member_id
        return ErrorCode.none if current == member_id else ErrorCode.fenced_instance_id

    def supports(self, protocol_type: str, names: set[str]) -> bool:
        if self.state is State.EMPTY:
            return bool(protocol_type) and bool(names)
        return protocol_type == self.protocol_type and bool(names & self.candidate_protocols())

    def candidate_protocols(self) -> set[str]:
        sets = [m.names() for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def select_protocol(self) -> str:
        """Each member votes for its most preferred protocol that all members support; most votes wins."""
        candidates = self.candidate_protocols()
        votes = Counter(next(n for n, _ in m.protocols if n in candidates) for m in self.members.values())
        return max(votes, key=lambda name: votes[name])  # ties: the first voted for (dicts keep order)

    def subscribed_topics(self) -> set[str] | None:
        if self.protocol_type != CONSUMER_PROTOCOL or self.protocol_name is None:
            return None
        topics: set[str] = set()
        for m in self.members.values():
            got = subscribed_topics(m.metadata(self.protocol_name))
            if got is None:
                return None
            topics |= got
        return topics

    def next_deadline(self) -> float:
        times = [d for d in (self.join_deadline, self.sync_deadline) if d is not None]
        times += self.pending_members.values()
        times += [m.heartbeat_deadline for m in self.members.values() if m.can_expire()]
        return min(times, default=NEVER)

    # ------------------------------------------------------------------ JoinGroup

    def join(self, now: float, *, ticket: int, member_id: str, instance_id: str | None, client_id: str,
             client_host: str, session_timeout_ms: int, rebalance_timeout_ms: int, protocol_type: str,
             protocols: list[tuple[str, bytes]], require_known_member_id: bool) -> JoinResult | None:
        """Kafka's handleJoinGroup (kafscale.groups.joining): an answer now, or None when the answer comes
        through `replies`."""
        return joining.join(self, now, ticket=ticket, member_id=member_id, instance_id=instance_id,
                            client_id=client_id, client_host=client_host, session_timeout_ms=session_timeout_ms,
                            rebalance_timeout_ms=rebalance_timeout_ms, protocol_type=protocol_type,
                            protocols=protocols, require_known_member_id=require_known_member_id)

    def _join_result(self, member_id: str) -> JoinResult:
        members = []
        if member_id == self.leader:
            members = [(m.member_id, m.instance_id, m.metadata(self.protocol_name)) for m in self.members.values()]
        return JoinResult(ErrorCode.none, member_id, self.generation, self.protocol_type, self.protocol_name,
                          self.leader or "", members)

    # ------------------------------------------------------------------ the rebalance barrier

    def _transition(self, state: State, now: float) -> None:
        self.state = state
        self.state_since = now

    def _prepare_rebalance(self, now: float, reason: str) -> None:
        log.info("group %s: rebalancing from %s, generation %d: %s", self.group_id, self.state.value,
                 self.generation, reason)
        if self.state is State.COMPLETING:
            self._propagate_assignment_error(now, ErrorCode.rebalance_in_progress)
        self.sync_deadline = None
        was_empty = self.state is State.EMPTY
        self._transition(State.PREPARING, now)
        delay = self.settings.initial_rebalance_delay_ms
        if was_empty and delay > 0:
            # Kafka's InitialDelayedJoin: wait for more members of a starting group, extended while they come.
            self.initial_delay = True
            self.initial_remaining_ms = max(self.rebalance_timeout_ms() - delay, 0)
            self.join_deadline = now + delay / 1000
        else:
            self.initial_delay = False
            self.join_deadline = now + self.rebalance_timeout_ms() / 1000
            self._try_complete_join(now)

    def _try_complete_join(self, now: float) -> None:
        if self.state is State.PREPARING and not self.initial_delay and self.all_members_joined():
            self._complete_join(now)

    def _complete_join(self, now: float) -> None:
        self.join_deadline = None
        self.initial_delay = False
        for m in list(self.members.values()):
            # Dynamic members that did not re-join in time are out; static ones keep their place.
            if m.join_ticket is None and m.instance_id is None:
                self._remove(m.member_id)
        if self.members and not self._elect_joined_leader():
            # Nobody re-joined (only absent static members): wait another round for their sessions to end.
            self.join_deadline = now + self.rebalance_timeout_ms() / 1000
            return
        self.generation += 1
        self.pending_sync.clear()
        if not self.members:
            self.protocol_name = None
            self._transition(State.EMPTY, now)
            self.store_requested = True
            return
        self.protocol_name = self.select_protocol()
        self._transition(State.COMPLETING, now)
        log.info("group %s: generation %d with %d members, protocol %s", self.group_id, self.generation,
                 len(self.members), self.protocol_name)
        for m in self.members.values():
            if m.join_ticket is not None:
                self.replies.append((m.join_ticket, self._join_result(m.member_id)))
                m.join_ticket = None
            m.heartbeat_deadline = now + m.session_timeout_ms / 1000
            m.is_new = False
            self.pending_sync.add(m.member_id)
        self.sync_deadline = now + self.rebalance_timeout_ms() / 1000

    def _elect_joined_leader(self) -> bool:
        if self.leader in self.members and self.members[self.leader].join_ticket is not None:
            return True
        joined = next((m.member_id for m in self.members.values() if m.join_ticket is not None), None)
        if joined is None:
            return False
        self.leader = joined
        return True

    # ------------------------------------------------------------------ SyncGroup

    def sync(self, now: float, *, ticket: int, member_id: str, instance_id: str | None, generation: int,
             protocol_type: str | None, protocol_name: str | None,
             assignments: dict[str, bytes]) -> SyncResult | None:
        if self.state is State.DEAD:
            return SyncResult(ErrorCode.coordinator_not_available)
        if (static := self.static_error(instance_id, member_id)) != ErrorCode.none:
            return SyncResult(static)
        if member_id not in self.members:
            return SyncResult(ErrorCode.unknown_member_id)
        if generation != self.generation:
            return SyncResult(ErrorCode.illegal_generation)
        if (protocol_type is not None and protocol_type != self.protocol_type) or (
                protocol_name is not None and protocol_name != self.protocol_name):
            return SyncResult(ErrorCode.inconsistent_group_protocol)
        if self.state is State.EMPTY:
            return SyncResult(ErrorCode.unknown_member_id)
        if self.state is State.PREPARING:
            return SyncResult(ErrorCode.rebalance_in_progress)
        member = self.members[member_id]
        self._sync_done(member_id)
        if self.state is State.STABLE:
            member.heartbeat_deadline = now + member.session_timeout_ms / 1000
            return SyncResult(ErrorCode.none, self.protocol_type, self.protocol_name, member.assignment)
        if member.sync_ticket is not None:
            self._reply_sync(member, SyncResult(ErrorCode.rebalance_in_progress))
        member.sync_ticket = ticket
        if member_id == self.leader:
            # Members the leader left out get an empty assignment; ids that are no members are ignored.
            self.pending_assignment = (self.generation, {m: assignments.get(m, b"") for m in self.members})
        return None

    def _sync_done(self, member_id: str) -> None:
        self.pending_sync.discard(member_id)
        if not self.pending_sync:
            self.sync_deadline = None

    def assignment_stored(self, now: float, generation: int, assignment: dict[str, bytes], error: ErrorCode) -> None:
        """The coordinator wrote (or failed to write) the leader's assignment: hand it out and become Stable."""
        self.pending_assignment = None
        if self.state is not State.COMPLETING or generation != self.generation:
            return  # the group moved on while the write was in flight
        if error != ErrorCode.none:
            self._propagate_assignment_error(now, error)
            self._prepare_rebalance(now, f"storing the assignment failed ({error.name})")
            return
        for m in self.members.values():
            m.assignment = assignment.get(m.member_id, b"")
            if m.sync_ticket is not None:
                self._reply_sync(m, SyncResult(ErrorCode.none, self.protocol_type, self.protocol_name, m.assignment))
                m.heartbeat_deadline = now + m.session_timeout_ms / 1000
        self._transition(State.STABLE, now)

    def _propagate_assignment_error(self, now: float, error: ErrorCode) -> None:
        for m in self.members.values():
            m.assignment = b""
            if m.sync_ticket is not None:
                self._reply_sync(m, SyncResult(error))
                m.heartbeat_deadline = now + m.session_timeout_ms / 1000

    # ------------------------------------------------------------------ Heartbeat, commits, LeaveGroup

    def heartbeat(self, now: float, member_id: str, instance_id: str | None, generation: int) -> ErrorCode:
        error = self._check_member(member_id, instance_id, generation)
        if error != ErrorCode.none:
            return error
        if self.state is State.EMPTY:
            return ErrorCode.unknown_member_id
        member = self.members[member_id]
        member.heartbeat_deadline = now + member.session_timeout_ms / 1000
        return ErrorCode.rebalance_in_progress if self.state is State.PREPARING else ErrorCode.none

    def check_commit(self, now: float, member_id: str, instance_id: str | None, generation: int) -> ErrorCode:
        """Kafka's validation of an OffsetCommit: generation -1 commits only into an Empty group."""
        if self.state is State.DEAD:
            return ErrorCode.coordinator_not_available
        if generation < 0 and self.state is State.EMPTY:
            return ErrorCode.none
        error = self._check_member(member_id, instance_id, generation)
        if error != ErrorCode.none:
            return error
        if self.state is State.COMPLETING:
            return ErrorCode.rebalance_in_progress
        if self.state is State.EMPTY:
            return ErrorCode.unknown_member_id
        member = self.members[member_id]
        member.heartbeat_deadline = now + member.session_timeout_ms / 1000
        return ErrorCode.none

    def _check_member(self, member_id: str, instance_id: str | None, generation: int) -> ErrorCode:
        if self.state is State.DEAD:
            return ErrorCode.coordinator_not_available
        if (static := self.static_error(instance_id, member_id)) != ErrorCode.none:
            return static
        if member_id not in self.members:
            return ErrorCode.unknown_member_id
        if generation != self.generation:
            return ErrorCode.illegal_generation
        return ErrorCode.none

    def leave(self, now: float, leaving: list[tuple[str, str | None]]) -> tuple[ErrorCode, list[ErrorCode]]:
        """Batch leave (KIP-345): members by id, or static members by group.instance.id alone."""
        if self.state is State.DEAD:
            return ErrorCode.coordinator_not_available, []
        errors = []
        for member_id, instance_id in leaving:
            if member_id == "":
                current = self.static_members.get(instance_id) if instance_id is not None else None
                if current is None or current not in self.members:
                    errors.append(ErrorCode.unknown_member_id)
                    continue
                member_id = current
            elif member_id in self.pending_members:
                del self.pending_members[member_id]
                self._try_complete_join(now)
                errors.append(ErrorCode.none)
                continue
            elif (static := self.static_error(instance_id, member_id)) != ErrorCode.none:
                errors.append(static)
                continue
            elif member_id not in self.members:
                errors.append(ErrorCode.unknown_member_id)
                continue
            self._remove_member(now, self.members[member_id], "left")
            errors.append(ErrorCode.none)
        return ErrorCode.none, errors

    def _remove_member(self, now: float, member: Member, reason: str) -> None:
        self._reply_join(member, JoinResult(ErrorCode.unknown_member_id, ""))
        self._reply_sync(member, SyncResult(ErrorCode.unknown_member_id))
        self._remove(member.member_id)
        if self.state in (State.STABLE, State.COMPLETING):
            self._prepare_rebalance(now, f"member {member.member_id} {reason}")
        else:
            self._try_complete_join(now)

    def _remove(self, member_id: str) -> None:
        member = self.members.pop(member_id)
        if member.instance_id is not None and self.static_members.get(member.instance_id) == member_id:
            del self.static_members[member.instance_id]
        if self.leader == member_id:
            self.leader = next(iter(self.members), None)
        self.pending_sync.discard(member_id)

    def _reply_join(self, member: Member, result: JoinResult) -> None:
        if member.join_ticket is not None:
            self.replies.append((member.join_ticket, result))
            member.join_ticket = None

    def _reply_sync(self, member: Member, result: SyncResult) -> None:
        if member.sync_ticket is not None:
            self.replies.append((member.sync_ticket, result))
            member.sync_ticket = None

    # ------------------------------------------------------------------ time

    def expire(self, now: float) -> None:
        """Apply every deadline that has passed: pending ids, sessions, SyncGroup and JoinGroup barriers."""
        for member_id, deadline in list(self.pending_members.items()):
            if deadline <= now:
                del self.pending_members[member_id]
                self._try_complete_join(now)
        for m in list(self.members.values()):
            if m.member_id in self.members and m.can_expire() and m.heartbeat_deadline <= now:
                self._remove_member(now, m, "session expired")
        if self.sync_deadline is not None and self.sync_deadline <= now:
            self.sync_deadline = None
            if self.state in (State.COMPLETING, State.STABLE) and self.pending_sync:
                for member_id in list(self.pending_sync):
                    if member_id in self.members:
                        self._remove(member_id)
                self._prepare_rebalance(now, "members did not send SyncGroup in time")
        if self.join_deadline is not None and self.join_deadline <= now and self.state is State.PREPARING:
            if self.initial_delay and self.new_member_added and self.initial_remaining_ms > 0:
                self.new_member_added = False
                delay = min(self.settings.initial_rebalance_delay_ms, self.initial_remaining_ms)
                self.initial_remaining_ms = max(self.initial_remaining_ms - delay, 0)
                self.join_deadline = now + delay / 1000
            else:
                self._complete_join(now)

    def mark_dead(self) -> None:
        """Deleted or lost to another coordinator: every waiting request must look for the coordinator again."""
        self.state = State.DEAD
        for m in self.members.values():
            self._reply_join(m, JoinResult(ErrorCode.not_coordinator, m.member_id))
            self._reply_sync(m, SyncResult(ErrorCode.not_coordinator))
