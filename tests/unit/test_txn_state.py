"""The pure rules of a transactional id's metadata: the stored form, EndTxn's answers in every state, fencing."""

from __future__ import annotations

import dataclasses

import pytest

from kafscale.protocol.errors import ErrorCode
from kafscale.transactions import state as rules
from kafscale.transactions.state import TxnMetadata, TxnState


def meta(state: TxnState, epoch: int = 3) -> TxnMetadata:
    return TxnMetadata("t/x", 7, epoch, state, 60_000, 100, last_producer_id=6, last_producer_epoch=2,
                       partitions=frozenset({("a", 0), ("b", 2)}), groups=frozenset({"g"}), start_ms=90,
                       coordinator_epoch=4)


def test_the_stored_form_round_trips() -> None:
    m = meta(TxnState.PREPARE_COMMIT)
    assert TxnMetadata.from_dict("t/x", m.to_dict()) == m


@pytest.mark.parametrize(("state", "commit", "answer"), [
    (TxnState.ONGOING, True, TxnState.PREPARE_COMMIT),
    (TxnState.ONGOING, False, TxnState.PREPARE_ABORT),
    (TxnState.COMPLETE_COMMIT, True, ErrorCode.none),
    (TxnState.COMPLETE_COMMIT, False, ErrorCode.invalid_txn_state),
    (TxnState.COMPLETE_ABORT, False, ErrorCode.none),
    (TxnState.COMPLETE_ABORT, True, ErrorCode.invalid_txn_state),
    (TxnState.PREPARE_COMMIT, True, ErrorCode.concurrent_transactions),
    (TxnState.PREPARE_COMMIT, False, ErrorCode.invalid_txn_state),
    (TxnState.PREPARE_ABORT, False, ErrorCode.concurrent_transactions),
    (TxnState.PREPARE_ABORT, True, ErrorCode.invalid_txn_state),
    (TxnState.EMPTY, True, ErrorCode.invalid_txn_state),
    (TxnState.EMPTY, False, ErrorCode.invalid_txn_state),
])
def test_end_txn_answers_as_kafka_in_every_state(state: TxnState, commit: bool, answer: object) -> None:
    result = rules.end(meta(state), 7, 3, commit, 200)
    assert (result.state if isinstance(result, TxnMetadata) else result) == answer


def test_end_txn_checks_the_producer_first() -> None:
    assert rules.end(meta(TxnState.ONGOING), 8, 3, True, 200) == ErrorCode.invalid_producer_id_mapping
    assert rules.end(meta(TxnState.ONGOING), 7, 2, True, 200) == ErrorCode.producer_fenced
    assert rules.end(meta(TxnState.ONGOING), 7, 4, True, 200) == ErrorCode.producer_fenced


def test_fencing_an_open_transaction_bumps_the_epoch_and_forgets_the_last_one() -> None:
    fenced = rules.fence_and_abort(meta(TxnState.ONGOING), 200)
    assert (fenced.state, fenced.producer_epoch, fenced.last_producer_epoch) == (TxnState.PREPARE_ABORT, 4, -1)
    done = rules.complete(fenced, 300)
    assert (done.state, done.partitions, done.groups) == (TxnState.COMPLETE_ABORT, frozenset(), frozenset())
    at_max = rules.fence_and_abort(meta(TxnState.ONGOING, rules.MAX_EPOCH), 200)
    assert at_max.producer_epoch == rules.MAX_EPOCH


def test_adding_to_a_finished_transaction_opens_a_new_one() -> None:
    opened = rules.add(meta(TxnState.COMPLETE_COMMIT), 7, 3, 500, partitions=frozenset({("c", 1)}))
    assert isinstance(opened, TxnMetadata)
    assert (opened.state, opened.partitions, opened.groups, opened.start_ms) == (
        TxnState.ONGOING, frozenset({("c", 1)}), frozenset(), 500)
    assert rules.add(meta(TxnState.ONGOING), 7, 3, 500, partitions=frozenset({("a", 0)})) == ErrorCode.none
    assert rules.add(meta(TxnState.PREPARE_ABORT), 7, 3, 500,
                     groups=frozenset({"h"})) == ErrorCode.concurrent_transactions


def test_timeouts_and_expiry() -> None:
    ongoing = meta(TxnState.ONGOING)
    assert not rules.timed_out(ongoing, 90 + 60_000) and rules.timed_out(ongoing, 91 + 60_000)
    assert not rules.expired(ongoing, 10**12, 1000)
    assert rules.expired(dataclasses.replace(ongoing, state=TxnState.COMPLETE_ABORT), 1101, 1000)
