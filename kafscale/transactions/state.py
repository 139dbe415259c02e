"""One transactional id's metadata (Kafka's TransactionMetadata) and the rules that move it: pure, I/O-free.

Every function here takes the current metadata and a request and returns either the metadata to write (a new,
frozen value: the coordinator writes it durably before adopting it) or the ErrorCode to answer. ErrorCode.none
as an answer means "nothing to write, succeed" (a retry of something already done).

The states and their meaning are Kafka's (TransactionState.scala):

    Empty            a producer id and epoch, no transaction open
    Ongoing          partitions (and groups) added; the transaction is open since start_ms
    PrepareCommit    EndTxn(commit) accepted: markers are being written; nothing may change until they are
    PrepareAbort     EndTxn(abort), a timeout or a new producer's InitProducerId: abort markers being written
    CompleteCommit   markers written; the transaction is over (partitions and groups cleared)
    CompleteAbort    likewise, aborted
    Dead             expired (its record is deleted; never stored)
    PrepareEpochFence  Kafka's transient state between fencing and aborting; here the fence and the
                     PrepareAbort are one write, so it is never stored either

Producer epochs are int16: an epoch at or past 32766 is exhausted and the next InitProducerId takes a new
producer id (keeping the old one as last_producer_id so that a KIP-360 retry is still recognised).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
from typing import Any

from kafscale.protocol.errors import ErrorCode

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
MAX_EPOCH = 32767  # Short.MaxValue

TopicPartition = tuple[str, int]


class TxnState(Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    DEAD = "Dead"
    PREPARE_EPOCH_FENCE = "PrepareEpochFence"

    @property
    def preparing(self) -> bool:
        """Markers are (or must be) in flight: the transaction cannot change until they are written."""
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT, TxnState.PREPARE_EPOCH_FENCE)

    @property
    def idle(self) -> bool:
        """No transaction open or ending: the id may expire."""
        return self in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)


@dataclass(frozen=True, slots=True)
class TxnMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: TxnState
    timeout_ms: int
    update_ms: int
    last_producer_id: int = NO_PRODUCER_ID
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    partitions: frozenset[TopicPartition] = frozenset()
    groups: frozenset[str] = frozenset()
    start_ms: int = -1  # when the first partition joined the open transaction
    coordinator_epoch: int = 0  # which coordinator incarnation wrote this (markers carry it)
    next_producer_id: int = NO_PRODUCER_ID  # transactions v2: the id the producer goes on with once this ends

    @property
    def epoch_exhausted(self) -> bool:
        return epoch_exhausted(self.producer_epoch)

    def to_dict(self) -> dict[str, Any]:
        return {"producer_id": self.producer_id, "producer_epoch": self.producer_epoch,
                "last_producer_id": self.last_producer_id, "last_producer_epoch": self.last_producer_epoch,
                "state": self.state.value, "partitions": [[t, p] for t, p in sorted(self.partitions)],
                "groups": sorted(self.groups), "timeout_ms": self.timeout_ms, "start_ms": self.start_ms,
                "update_ms": self.update_ms, "coordinator_epoch": self.coordinator_epoch,
                **({"next_producer_id": self.next_producer_id} if self.next_producer_id != NO_PRODUCER_ID else {})}

    @classmethod
    def from_dict(cls, transactional_id: str, d: dict[str, Any]) -> TxnMetadata:
        return cls(transactional_id=transactional_id, producer_id=int(d["producer_id"]),
                   producer_epoch=int(d["producer_epoch"]), state=TxnState(d["state"]),
                   timeout_ms=int(d["timeout_ms"]), update_ms=int(d["update_ms"]),
                   last_producer_id=int(d.get("last_producer_id", NO_PRODUCER_ID)),
                   last_producer_epoch=int(d.get("last_producer_epoch", NO_PRODUCER_EPOCH)),
                   partitions=frozenset((str(t), int(p)) for t, p in d.get("partitions", ())),
                   groups=frozenset(d.get("groups", ())), start_ms=int(d.get("start_ms", -1)),
                   coordinator_epoch=int(d.get("coordinator_epoch", 0)),
                   next_producer_id=int(d.get("next_producer_id", NO_PRODUCER_ID)))


def epoch_exhausted(epoch: int) -> bool:
    """Kafka keeps one epoch in reserve so that the coordinator can still fence an exhausted producer."""
    return epoch >= MAX_EPOCH - 1


def valid_timeout(timeout_ms: int, max_timeout_ms: int) -> bool:
    return 0 < timeout_ms <= max_timeout_ms


def new_metadata(transactional_id: str, producer_id: int, timeout_ms: int, now_ms: int) -> TxnMetadata:
    """A transactional id seen for the first time: epoch -1, so that the InitProducerId bump makes it 0."""
    return TxnMetadata(transactional_id, producer_id, NO_PRODUCER_EPOCH, TxnState.EMPTY, timeout_ms, now_ms)


# ---------------------------------------------------------------- InitProducerId


def check_expected_producer(meta: TxnMetadata, expected: tuple[int, int] | None) -> ErrorCode:
    """KIP-360: a producer re-initialising names its id and epoch; it must be this id's current or previous
    producer (previous: only across an exhausted epoch's rotation). PRODUCER_FENCED otherwise."""
    if expected is None or meta.producer_epoch == NO_PRODUCER_EPOCH:
        return ErrorCode.none
    pid, epoch = expected
    if pid == meta.producer_id or (pid == meta.last_producer_id and epoch_exhausted(epoch)):
        return ErrorCode.none
    return ErrorCode.producer_fenced


def needs_new_producer_id(meta: TxnMetadata, expected: tuple[int, int] | None) -> bool:
    """The epoch cannot be bumped again: InitProducerId takes a new producer id (see `rotate`)."""
    return meta.epoch_exhausted and (expected is None or expected[1] == meta.producer_epoch)


def rotate(meta: TxnMetadata, new_producer_id: int, timeout_ms: int, now_ms: int,
           expected: tuple[int, int] | None) -> TxnMetadata:
    """A new producer id at epoch 0; the old one is remembered so that a retry of this call is recognised."""
    return dataclasses.replace(
        meta, producer_id=new_producer_id, producer_epoch=0, last_producer_id=meta.producer_id,
        last_producer_epoch=meta.producer_epoch if expected is not None else NO_PRODUCER_EPOCH,
        state=TxnState.EMPTY, timeout_ms=timeout_ms, update_ms=now_ms, partitions=frozenset(), groups=frozenset(),
        start_ms=-1)


def bump_epoch(meta: TxnMetadata, expected_epoch: int | None, timeout_ms: int,
               now_ms: int) -> TxnMetadata | ErrorCode:
    """InitProducerId in Empty or Complete*: the next epoch, which fences every older producer of this id.

    With an expected epoch (KIP-360): the current one bumps (the producer recovers from an error and nobody
    else took over); the previous one is a retry of a bump that succeeded: the current epoch again, unbumped.
    """
    bumped = meta.producer_epoch + 1
    last = NO_PRODUCER_EPOCH
    if expected_epoch is not None:
        if meta.producer_epoch == NO_PRODUCER_EPOCH or expected_epoch == meta.producer_epoch:
            last = meta.producer_epoch
        elif expected_epoch == meta.last_producer_epoch:  # a retry: what the first call answered
            return dataclasses.replace(meta, state=TxnState.EMPTY, timeout_ms=timeout_ms, update_ms=now_ms,
                                       partitions=frozenset(), groups=frozenset(), start_ms=-1)
        else:
            return ErrorCode.producer_fenced
    return dataclasses.replace(meta, producer_epoch=bumped, last_producer_id=meta.producer_id,
                               last_producer_epoch=last, state=TxnState.EMPTY, timeout_ms=timeout_ms,
                               update_ms=now_ms, partitions=frozenset(), groups=frozenset(), start_ms=-1)


def fence_and_abort(meta: TxnMetadata, now_ms: int) -> TxnMetadata:
    """An open transaction whose producer is replaced (InitProducerId) or timed out: PrepareAbort at the next
    epoch (Kafka's PrepareEpochFence then PrepareAbort, in one write). The abort markers carry that epoch, so
    the old producer is fenced in every partition; last_producer_epoch goes, so its KIP-360 retry is fenced too."""
    epoch = meta.producer_epoch + 1 if meta.producer_epoch < MAX_EPOCH else meta.producer_epoch
    return dataclasses.replace(meta, producer_epoch=epoch, last_producer_epoch=NO_PRODUCER_EPOCH,
                               state=TxnState.PREPARE_ABORT, update_ms=now_ms)


# ---------------------------------------------------------------- AddPartitionsToTxn, AddOffsetsToTxn


def check_producer(meta: TxnMetadata, producer_id: int, producer_epoch: int) -> ErrorCode:
    """The request's producer must be this id's current one (Kafka's strict check for client requests)."""
    if meta.producer_id != producer_id:
        return ErrorCode.invalid_producer_id_mapping
    if meta.producer_epoch != producer_epoch:
        return ErrorCode.producer_fenced
    if meta.state.preparing:
        return ErrorCode.concurrent_transactions
    return ErrorCode.none


def add(meta: TxnMetadata, producer_id: int, producer_epoch: int, now_ms: int, *,
        partitions: frozenset[TopicPartition] = frozenset(),
        groups: frozenset[str] = frozenset()) -> TxnMetadata | ErrorCode:
    """Partitions (or a group's offsets) join the transaction, opening it if none is open. ErrorCode.none: they
    are in it already (nothing to write)."""
    error = check_producer(meta, producer_id, producer_epoch)
    if error != ErrorCode.none:
        return error
    if meta.state is TxnState.ONGOING and partitions <= meta.partitions and groups <= meta.groups:
        return ErrorCode.none
    opening = meta.state is not TxnState.ONGOING
    return dataclasses.replace(meta, state=TxnState.ONGOING, update_ms=now_ms,
                               partitions=(frozenset() if opening else meta.partitions) | partitions,
                               groups=(frozenset() if opening else meta.groups) | groups,
                               start_ms=now_ms if opening else meta.start_ms)


def verify(meta: TxnMetadata | None, producer_id: int, producer_epoch: int,
           partitions: list[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
    """KIP-890 part 1 (AddPartitionsToTxn v4+ verify_only): is each partition in the open transaction?"""
    if meta is None:
        return dict.fromkeys(partitions, ErrorCode.invalid_producer_id_mapping)
    error = check_producer(meta, producer_id, producer_epoch)
    if error != ErrorCode.none:
        return dict.fromkeys(partitions, error)
    return {tp: ErrorCode.none if meta.state is TxnState.ONGOING and tp in meta.partitions
            else ErrorCode.invalid_txn_state for tp in partitions}


def verify_group(meta: TxnMetadata | None, producer_id: int, producer_epoch: int, group_id: str) -> ErrorCode:
    """KIP-890 part 1 for TxnOffsetCommit: did AddOffsetsToTxn put the group in the open transaction?"""
    if meta is None:
        return ErrorCode.invalid_producer_id_mapping
    error = check_producer(meta, producer_id, producer_epoch)
    if error != ErrorCode.none:
        return error
    return ErrorCode.none if meta.state is TxnState.ONGOING and group_id in meta.groups else ErrorCode.invalid_txn_state


# ---------------------------------------------------------------- EndTxn and completion


def end(meta: TxnMetadata, producer_id: int, producer_epoch: int, commit: bool,
        now_ms: int) -> TxnMetadata | ErrorCode:
    """EndTxn from the client: Ongoing goes to Prepare*; a retry of an ending already done (or under way) is
    NONE (or CONCURRENT_TRANSACTIONS, come back); the other ending, or no transaction, is INVALID_TXN_STATE."""
    if meta.producer_id != producer_id:
        return ErrorCode.invalid_producer_id_mapping
    if meta.producer_epoch != producer_epoch:
        return ErrorCode.producer_fenced
    state = meta.state
    if state is TxnState.ONGOING:
        return dataclasses.replace(meta, state=TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT,
                                   update_ms=now_ms)
    if state is TxnState.COMPLETE_COMMIT:
        return ErrorCode.none if commit else ErrorCode.invalid_txn_state
    if state is TxnState.COMPLETE_ABORT:
        return ErrorCode.none if not commit else ErrorCode.invalid_txn_state
    if state is TxnState.PREPARE_COMMIT:
        return ErrorCode.concurrent_transactions if commit else ErrorCode.invalid_txn_state
    if state is TxnState.PREPARE_ABORT:
        return ErrorCode.concurrent_transactions if not commit else ErrorCode.invalid_txn_state
    if state is TxnState.PREPARE_EPOCH_FENCE:
        return ErrorCode.concurrent_transactions
    return ErrorCode.invalid_txn_state  # Empty, Dead


def end_v2(meta: TxnMetadata, producer_id: int, producer_epoch: int, commit: bool,
           now_ms: int) -> TxnMetadata | ErrorCode:
    """EndTxn v5+ (transactions v2, KIP-890 part 2): every ending bumps the producer epoch. The Prepare* record
    holds epoch E+1 (the markers carry it, fencing anything the producer still sends at E) and E as the last
    epoch, which is how a retry from a producer that missed the answer is recognised: it still says E. When that
    uses the epoch's last value (`needs_next_producer_id`), the coordinator also allocates the producer id the
    producer goes on with from epoch 0 (`next_producer_id`, taken up by `complete`).

    Also unlike the first protocol, an abort with no transaction open is a real ending (an empty abort: the
    epoch bumps), since a v2 producer recovers from abortable errors that way."""
    retry = _v2_retry(meta, producer_id, producer_epoch)
    if meta.producer_id != producer_id and not retry:
        return ErrorCode.invalid_producer_id_mapping
    state = meta.state
    if state.preparing:
        if not retry:
            return ErrorCode.producer_fenced
        same = (state is TxnState.PREPARE_COMMIT) == commit and state is not TxnState.PREPARE_EPOCH_FENCE
        return ErrorCode.concurrent_transactions if same else ErrorCode.invalid_txn_state
    if state in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT):
        if retry:  # the answer was lost: the same outcome again is done, the other one is not possible
            return ErrorCode.none if (state is TxnState.COMPLETE_COMMIT) == commit else ErrorCode.invalid_txn_state
        if meta.producer_epoch != producer_epoch:
            return ErrorCode.producer_fenced
        if commit:
            return ErrorCode.invalid_txn_state
        return _prepare_v2(meta, False, now_ms)  # a new, empty abort
    if meta.producer_epoch != producer_epoch:
        return ErrorCode.producer_fenced
    if state is TxnState.ONGOING:
        return _prepare_v2(meta, commit, now_ms)
    if state is TxnState.EMPTY and not commit:
        return _prepare_v2(meta, False, now_ms)
    return ErrorCode.invalid_txn_state  # Empty (commit), Dead


def _v2_retry(meta: TxnMetadata, producer_id: int, producer_epoch: int) -> bool:
    """The request is from the producer as it was before the last ending bumped it: it missed the answer, or the
    coordinator ended the transaction itself (its timeout aborts at E+1). Kafka's rule, which lets a v2 producer
    whose transaction timed out abort and carry on. (After an InitProducerId the state is Empty, never taken for
    a retry, and the epoch is two ahead of the fenced producer's.)"""
    if meta.producer_id == producer_id:
        return meta.producer_epoch == producer_epoch + 1
    # across an exhausted epoch: the ending moved the producer to a new id at epoch 0
    return meta.last_producer_id == producer_id and meta.producer_epoch == 0 and epoch_exhausted(producer_epoch)


def _prepare_v2(meta: TxnMetadata, commit: bool, now_ms: int) -> TxnMetadata:
    opening = meta.state is not TxnState.ONGOING
    return dataclasses.replace(
        meta, state=TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT, update_ms=now_ms,
        producer_epoch=min(meta.producer_epoch + 1, MAX_EPOCH), last_producer_id=meta.producer_id,
        last_producer_epoch=meta.producer_epoch, partitions=frozenset() if opening else meta.partitions,
        groups=frozenset() if opening else meta.groups, start_ms=meta.start_ms if not opening else -1)


def needs_next_producer_id(prepared: TxnMetadata) -> bool:
    """A v2 ending that bumped the epoch to its last value: the producer goes on with a new id."""
    return prepared.producer_epoch >= MAX_EPOCH and prepared.next_producer_id == NO_PRODUCER_ID


def after_v2(meta: TxnMetadata) -> tuple[int, int]:
    """The producer id and epoch a v2 producer goes on with once this (prepared or completed) ending is done."""
    if meta.next_producer_id != NO_PRODUCER_ID:
        return meta.next_producer_id, 0
    return meta.producer_id, meta.producer_epoch


def complete(meta: TxnMetadata, now_ms: int) -> TxnMetadata:
    """Every marker written and every group's offsets settled: the transaction is over. A v2 ending that took a
    new producer id moves to it now (the markers went out under the old one)."""
    state = TxnState.COMPLETE_COMMIT if meta.state is TxnState.PREPARE_COMMIT else TxnState.COMPLETE_ABORT
    done = dataclasses.replace(meta, state=state, update_ms=now_ms, partitions=frozenset(), groups=frozenset())
    if meta.next_producer_id != NO_PRODUCER_ID:
        done = dataclasses.replace(done, producer_id=meta.next_producer_id, producer_epoch=0,
                                   last_producer_id=meta.producer_id, next_producer_id=NO_PRODUCER_ID)
    return done


def timed_out(meta: TxnMetadata, now_ms: int) -> bool:
    return meta.state is TxnState.ONGOING and meta.start_ms >= 0 and now_ms > meta.start_ms + meta.timeout_ms


def expired(meta: TxnMetadata, now_ms: int, expiration_ms: int) -> bool:
    return meta.state.idle and now_ms > meta.update_ms + expiration_ms
