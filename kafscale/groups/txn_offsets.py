"""Transactional offsets of one group (TxnOffsetCommit, KIP-98): held for a producer's open transaction, and
the group's committed offsets only once that transaction commits.

A transactional producer sends TxnOffsetCommit to the group's coordinator; the offsets are *pending*: stored
(`group_txn_offsets/{g}/{producer_id}`, one record per producer, written with the coordinator's fencing like
every other write of the group) but not answered by OffsetFetch. When the transaction ends, its coordinator
calls the group coordinator (`GroupRegistry.complete_txn_offsets`): on commit the pending offsets become
committed offsets, on abort they are dropped; either way the record goes. Both are idempotent, because the
transaction coordinator repeats a completion it is not sure of (after a crash).

This module decides (no I/O): the stored value, Kafka's validation of a transactional commit, the producer
epoch rules, which pending offsets a commit makes visible. The coordinator (coordinator.py) does the writes.

Producer epochs. The transaction coordinator begins a producer's transaction at an epoch only after every
transaction of an older epoch of that producer id has ended (and been completed here), so:
* a TxnOffsetCommit older than the pending record's epoch comes from a fenced producer: INVALID_PRODUCER_EPOCH
  (Kafka's answer in every version: its log rejects the older epoch, and transaction verification maps
  PRODUCER_FENCED to it);
* a newer one starts over: the older epoch's offsets can only be a zombie's, written after its transaction
  ended (Kafka keeps them until the next marker; dropping them keeps a zombie's offsets out of a commit);
* a completion older than the pending record's epoch is stale (a retry from before the newer transaction) and
  must not complete the newer transaction's offsets: INVALID_PRODUCER_EPOCH, nothing changes. A completion may
  carry a newer epoch than the offsets: transaction version 2 bumps the epoch with EndTxn, and an abort on
  InitProducerId carries the bumped one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.cluster import keys
from kafscale.groups.offsets import OffsetEntry, TopicPartition
from kafscale.groups.state import Group, State


@dataclass(frozen=True, slots=True)
class PendingOffsets:
    """The offsets one producer's open transaction commits to the group (the stored record)."""

    producer_id: int
    producer_epoch: int
    transactional_id: str
    started_ms: int  # the transaction's first TxnOffsetCommit here (a record older than retention is dropped)
    offsets: Mapping[TopicPartition, OffsetEntry]  # commit_ms: when the TxnOffsetCommit was accepted

    def to_value(self) -> dict[str, Any]:
        return {"producer_epoch": self.producer_epoch, "transactional_id": self.transactional_id,
                "started_ms": self.started_ms,
                "offsets": [[t, p, e.to_value()] for (t, p), e in sorted(self.offsets.items())]}

    @classmethod
    def from_value(cls, producer_id: int, value: dict[str, Any]) -> PendingOffsets:
        return cls(producer_id, int(value["producer_epoch"]), str(value.get("transactional_id", "")),
                   int(value.get("started_ms", 0)),
                   {(str(t), int(p)): OffsetEntry.from_value(e) for t, p, e in value.get("offsets", [])})

    def partitions(self) -> set[TopicPartition]:
        return set(self.offsets)


@dataclass(frozen=True, slots=True)
class Completion:
    """What ending one producer's transaction does to the group: the offsets to write as committed (none on
    abort, and none that a later plain commit has overtaken), and the record to delete."""

    producer_id: int
    committed: dict[TopicPartition, OffsetEntry]


def parse_pending(group_id: str, kvs: Sequence[Any]) -> dict[int, PendingOffsets]:
    """The pending records of a group, by producer id, from a range read of `keys.group_txn_offsets`."""
    prefix = len(keys.group_txn_offsets(group_id))
    out = {}
    for kv in kvs:
        producer_id = int(kv.key[prefix:])
        out[producer_id] = PendingOffsets.from_value(producer_id, kv.value)
    return out


def check_txn_commit(group: Group, member_id: str, instance_id: str | None, generation: int) -> ErrorCode:
    """Kafka's validation of a TxnOffsetCommit against the group (ClassicGroup.validateOffsetCommit with
    isTransactional): like OffsetCommit, except that a commit naming no member (v0-v2 cannot name one) is
    accepted into a group with members, and a group completing a rebalance is no reason to refuse."""
    if group.state is State.DEAD:
        return ErrorCode.coordinator_not_available
    if generation < 0 and group.state is State.EMPTY:
        return ErrorCode.none
    if generation >= 0 or member_id or instance_id is not None:
        if (static := group.static_error(instance_id, member_id)) != ErrorCode.none:
            return static
        if member_id not in group.members:
            return ErrorCode.unknown_member_id
        if generation != group.generation:
            return ErrorCode.illegal_generation
    return ErrorCode.none


def check_epoch(pending: Mapping[int, PendingOffsets], producer_id: int, producer_epoch: int) -> ErrorCode:
    """A TxnOffsetCommit from an epoch older than the producer's pending offsets is a fenced producer's."""
    current = pending.get(producer_id)
    if current is not None and producer_epoch < current.producer_epoch:
        return ErrorCode.invalid_producer_epoch
    return ErrorCode.none


def add_offsets(current: PendingOffsets | None, producer_id: int, producer_epoch: int, transactional_id: str,
                entries: Iterable[tuple[str, int, OffsetEntry]], now_ms: int) -> PendingOffsets:
    """The producer's record after one more TxnOffsetCommit (check_epoch passed): a later commit of a partition
    in the same transaction replaces the earlier one; a newer epoch starts a new record (module docstring)."""
    same = current is not None and current.producer_epoch == producer_epoch
    offsets = dict(current.offsets) if same and current is not None else {}
    offsets.update({(t, p): e for t, p, e in entries})
    started = current.started_ms if same and current is not None else now_ms
    return PendingOffsets(producer_id, producer_epoch, transactional_id, started, offsets)


def complete(pending: Mapping[int, PendingOffsets], committed: Mapping[TopicPartition, OffsetEntry],
             producer_id: int, producer_epoch: int, commit: bool, now_ms: int) -> tuple[ErrorCode, Completion | None]:
    """The end of a producer's transaction at this group: (error, None) when nothing is to be done (no record:
    already completed, or never any offsets; or a stale completion), else what to write.

    On commit each pending offset becomes the committed one, with the commit time now (retention counts from
    it), unless a plain OffsetCommit of that partition was accepted after the TxnOffsetCommit: Kafka keeps the
    later of the two (by their place in its log; here by acceptance time)."""
    record = pending.get(producer_id)
    if record is None:
        return ErrorCode.none, None
    if producer_epoch < record.producer_epoch:
        return ErrorCode.invalid_producer_epoch, None
    offsets: dict[TopicPartition, OffsetEntry] = {}
    if commit:
        for tp, entry in record.offsets.items():
            existing = committed.get(tp)
            if existing is None or existing.commit_ms <= entry.commit_ms:
                offsets[tp] = dataclasses.replace(entry, commit_ms=now_ms)
    return ErrorCode.none, Completion(producer_id, offsets)


def pending_partitions(pending: Mapping[int, PendingOffsets]) -> set[TopicPartition]:
    """Partitions with offsets in an open transaction: OffsetFetch with require_stable answers
    UNSTABLE_OFFSET_COMMIT for them, and retention neither expires their committed offsets nor removes the
    group (Kafka's hasPendingTransactionalOffsets)."""
    return set().union(*(r.partitions() for r in pending.values()))


def abandoned(pending: Mapping[int, PendingOffsets], now_ms: int, max_age_ms: int) -> list[int]:
    """Producers whose pending offsets have outlived the offsets' retention. No transaction stays open that
    long (its coordinator aborts it after transaction.max.timeout.ms, 15 minutes at most), so only a
    completion that can never come (the transactional id's state lost) leaves such a record: it is an abort."""
    return sorted(pid for pid, r in pending.items() if now_ms - r.started_ms >= max_age_ms)
