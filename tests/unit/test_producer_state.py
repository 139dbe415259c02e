"""Kafka's idempotent-producer sequence rules, on ProducerStates alone (the owner-level behaviour is in
test_partition_owner.py)."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from kafscale.broker.producer_state import MAX_CACHED_BATCHES, BatchMeta, ProducerEntry, ProducerStates
from kafscale.storage.batch import BatchHeader

INT32_MAX = 2**31 - 1


def header(pid: int, epoch: int, seq: int, records: int = 1) -> BatchHeader:
    return BatchHeader(
        base_offset=0, batch_length=49 + 8 * records, partition_leader_epoch=-1, magic=2, crc=0, attributes=0,
        last_offset_delta=records - 1, first_timestamp=0, max_timestamp=0, producer_id=pid, producer_epoch=epoch,
        base_sequence=seq, record_count=records,
    )


def accept(states: ProducerStates, h: BatchHeader, base_offset: int) -> None:
    assert states.check(h) is None
    states.record(h, base_offset)


def test_unknown_producer_starts_at_any_sequence() -> None:
    # Kafka accepts any sequence from a producer it has no state for (its state may have aged out).
    states = ProducerStates()
    assert states.check(header(1, 0, 0)) is None
    assert states.check(header(1, 0, 1234)) is None


def test_in_sequence_batches_are_accepted() -> None:
    states = ProducerStates()
    offset = 0
    for seq, records in ((0, 3), (3, 1), (4, 5)):
        accept(states, header(1, 0, seq, records), offset)
        offset += records
    assert states.entries[1].last_seq == 8
    assert states.check(header(1, 0, 9)) is None


@pytest.mark.parametrize("age", range(MAX_CACHED_BATCHES))
def test_exact_retry_of_any_of_the_last_five_batches_returns_its_offsets(age: int) -> None:
    states = ProducerStates()
    for i in range(7):
        accept(states, header(1, 0, 2 * i, 2), 100 + 2 * i)
    i = 6 - age
    assert states.check(header(1, 0, 2 * i, 2)) == BatchMeta(2 * i, 2 * i + 1, 100 + 2 * i, 101 + 2 * i)


def test_retries_older_than_five_batches_or_not_matching_exactly_are_out_of_order() -> None:
    states = ProducerStates()
    for i in range(6):
        accept(states, header(1, 0, 2 * i, 2), 2 * i)
    assert states.check(header(1, 0, 0, 2)) == ErrorCode.out_of_order_sequence_number  # sixth-newest
    assert states.check(header(1, 0, 4, 1)) == ErrorCode.out_of_order_sequence_number  # same start, other end
    assert states.check(header(1, 0, 5, 2)) == ErrorCode.out_of_order_sequence_number  # overlapping


def test_sequence_gap_is_out_of_order() -> None:
    states = ProducerStates()
    accept(states, header(1, 0, 0, 2), 0)
    assert states.check(header(1, 0, 3)) == ErrorCode.out_of_order_sequence_number
    assert states.check(header(1, 0, 2)) is None


def test_stale_epoch_is_refused_even_for_a_retry() -> None:
    states = ProducerStates()
    accept(states, header(1, 5, 0), 0)
    assert states.check(header(1, 4, 1)) == ErrorCode.invalid_producer_epoch
    assert states.check(header(1, 4, 0)) == ErrorCode.invalid_producer_epoch


def test_new_epoch_must_start_at_sequence_zero_and_replaces_the_history() -> None:
    states = ProducerStates()
    accept(states, header(1, 0, 0, 3), 0)
    assert states.check(header(1, 1, 3)) == ErrorCode.out_of_order_sequence_number
    accept(states, header(1, 1, 0), 3)
    assert states.entries[1].epoch == 1
    assert states.check(header(1, 0, 0, 3)) == ErrorCode.invalid_producer_epoch  # the old epoch's retry
    assert states.check(header(1, 1, 0)) == BatchMeta(0, 0, 3, 3)


def test_sequence_wraps_to_zero_after_int32_max() -> None:
    states = ProducerStates()
    accept(states, header(1, 0, INT32_MAX - 1, 2), 0)  # INT32_MAX - 1, INT32_MAX
    assert states.check(header(1, 0, INT32_MAX)) == ErrorCode.out_of_order_sequence_number
    accept(states, header(1, 0, 0), 2)
    # A batch spanning the wrap: INT32_MAX, 0, 1.
    accept(states, header(2, 0, INT32_MAX, 3), 3)
    assert states.entries[2].last_seq == 1
    assert states.check(header(2, 0, INT32_MAX, 3)) == BatchMeta(INT32_MAX, 1, 3, 5)
    assert states.check(header(2, 0, 2)) is None
    assert states.check(header(2, 0, 0)) == ErrorCode.out_of_order_sequence_number


def test_negative_sequence_from_an_idempotent_producer_is_invalid() -> None:
    assert ProducerStates().check(header(1, 0, -1)) == ErrorCode.invalid_record


def test_producers_are_independent() -> None:
    states = ProducerStates()
    accept(states, header(1, 0, 0, 4), 0)
    accept(states, header(2, 7, 0, 1), 4)
    assert states.check(header(2, 7, 1)) is None
    assert states.check(header(1, 0, 4)) is None
    assert states.check(header(2, 7, 4)) == ErrorCode.out_of_order_sequence_number


def test_entry_survives_its_metadata_value_and_copies_are_snapshots() -> None:
    states = ProducerStates()
    for i in range(MAX_CACHED_BATCHES + 2):
        accept(states, header(1, 3, i), i)
    entry = states.entries[1]
    snapshot = entry.copy()
    restored = ProducerStates()
    restored.entries[1] = ProducerEntry.from_value(entry.to_value())
    assert list(restored.entries[1].batches) == list(entry.batches)
    assert restored.check(header(1, 3, 2)) == BatchMeta(2, 2, 2, 2)
    assert restored.check(header(1, 3, 7)) is None

    states.record(header(1, 3, 7), 7)
    assert snapshot.last_seq == 6 and entry.last_seq == 7
    assert len(snapshot.batches) == MAX_CACHED_BATCHES
