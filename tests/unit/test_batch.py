"""The v2 record batch header: parsing against aiokafka's builder, validation, in-place patches."""

from __future__ import annotations

import pickle
import struct
from itertools import accumulate

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.storage.batch import (
    CORRUPT_MESSAGE,
    HEADER_SIZE,
    INVALID_RECORD,
    BatchHeader,
    CorruptSegmentError,
    InvalidBatchError,
    batch_size,
    check_crc,
    client_batch_problem,
    count_records,
    read_header,
    set_base_offset,
    set_log_append_time,
    split_batches,
)
from tests.strategies import BatchSpec, Record, batch_specs, build_batch, decode, no_deadline, reseal

KEY = "ns/orders/0/segment-00000000000000000000.kfs"


def simple_batch(records: int = 3, *, codec: int = 0, base_offset: int = 0) -> bytearray:
    spec = BatchSpec(
        codec=codec,
        transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        records=tuple(Record(1_000 + i, b"k%d" % i, b"v" * 40, (("h", b"x"),)) for i in range(records)),
    )
    return build_batch(spec, base_offset)


def assert_names_place(exc: InvalidBatchError, key: str | None, position: int) -> None:
    assert exc.key == key
    assert exc.position == position
    assert f"byte {position}" in str(exc)
    if key is not None:
        assert repr(key) in str(exc)


@no_deadline
@given(batch_specs(), st.integers(0, 2**62))
def test_header_fields_match_aiokafka(spec: BatchSpec, base: int) -> None:
    data = build_batch(spec, base)
    header = read_header(data)
    ref = decode(data)
    n = len(spec.records)
    assert header.base_offset == ref.base_offset == base
    assert header.size == len(data)
    assert header.magic == 2
    assert header.crc == ref.crc
    assert header.attributes == ref.attributes
    assert header.compression == ref.compression_type == spec.codec
    assert header.last_offset_delta == ref.last_offset_delta == n - 1
    assert header.last_offset == base + n - 1
    assert header.record_count == n
    assert header.first_timestamp == ref.first_timestamp == spec.records[0].timestamp
    assert header.max_timestamp == ref.max_timestamp == max(r.timestamp for r in spec.records)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (
        ref.producer_id,
        ref.producer_epoch,
        ref.base_sequence,
    )
    assert header.timestamp_type == ref.timestamp_type == 0
    assert header.is_transactional == ref.is_transactional == spec.transactional
    assert not header.is_control
    check_crc(data, 0, header)


def test_header_reads_from_memoryview_at_offset() -> None:
    data = bytes(simple_batch(2, base_offset=7))
    buf = memoryview(b"\x00" * 5 + data)
    assert read_header(buf, 5) == read_header(data)


def test_control_bit() -> None:
    data = simple_batch(1)
    data[22] |= 0x20
    reseal(data)
    header = read_header(data)
    assert header.is_control
    assert decode(data).is_control_batch


@no_deadline
@given(st.lists(batch_specs(max_records=4), max_size=5), st.integers(0, 10_000))
def test_split_finds_every_batch(specs: list[BatchSpec], base_position: int) -> None:
    parts = [build_batch(spec) for spec in specs]
    found = split_batches(b"".join(parts), base_position=base_position)
    starts = [0, *accumulate(len(p) for p in parts)][:-1]
    assert [pos for pos, _ in found] == starts
    assert [header.size for _, header in found] == [len(p) for p in parts]
    assert [header.record_count for _, header in found] == [len(s.records) for s in specs]


def test_split_empty_buffer_is_empty() -> None:
    assert split_batches(b"") == []


def test_trailing_partial_batch_at_every_cut() -> None:
    first, second = simple_batch(2), simple_batch(3, codec=1)
    buf = bytes(first + second)
    for cut in range(1, len(buf)):
        if cut == len(first):
            assert len(split_batches(buf[:cut])) == 1
            continue
        with pytest.raises(InvalidBatchError) as info:
            split_batches(buf[:cut], key=KEY, base_position=1_000)
        assert info.value.error_code == CORRUPT_MESSAGE
        assert_names_place(info.value, KEY, 1_000 + (0 if cut < len(first) else len(first)))


def test_every_byte_flip_is_caught_except_the_two_fields_the_broker_rewrites() -> None:
    """Kafka's CRC starts at byte 21. Bytes 0-7 (base offset) and 12-15 (partition leader epoch) are
    outside it by design: the broker overwrites both. Inside a segment the footer CRC covers them (see
    test_segment). Every other byte is caught by the CRC or by a structural check."""
    original = bytes(simple_batch(3, codec=2))
    uncovered = set(range(0, 8)) | set(range(12, 16))
    for i in range(len(original)):
        for mask in (0x01, 0x80, 0xFF):
            data = bytearray(original)
            data[i] ^= mask
            if i in uncovered:
                assert len(split_batches(data)) == 1
                continue
            with pytest.raises(InvalidBatchError) as info:
                split_batches(data, key=KEY)
            assert info.value.position == 0


def test_crc_mismatch_names_key_and_position() -> None:
    data = simple_batch(2) + simple_batch(2)
    second = len(data) // 2
    data[-1] ^= 0x10
    header = read_header(data, second)
    with pytest.raises(InvalidBatchError) as info:
        check_crc(data, second, header, key=KEY)
    assert info.value.error_code == CORRUPT_MESSAGE
    assert "CRC32C mismatch" in info.value.reason
    assert_names_place(info.value, KEY, second)


def edited(offset: int, fmt: str, value: int) -> bytearray:
    data = simple_batch(3)
    struct.pack_into(fmt, data, offset, value)
    reseal(data)
    return data


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "code"),
    [
        pytest.param(57, ">i", -1, INVALID_RECORD, id="record-count-negative"),
        pytest.param(57, ">i", 4, INVALID_RECORD, id="record-count-above-offset-range"),
        pytest.param(23, ">i", -1, INVALID_RECORD, id="last-offset-delta-negative"),
        pytest.param(22, ">b", 5, INVALID_RECORD, id="codec-5"),
        pytest.param(22, ">b", 7, INVALID_RECORD, id="codec-7"),
        pytest.param(16, ">b", 0, INVALID_RECORD, id="magic-0-legacy"),
        pytest.param(16, ">b", 1, INVALID_RECORD, id="magic-1-legacy"),
        pytest.param(16, ">b", 3, CORRUPT_MESSAGE, id="magic-3"),
        pytest.param(16, ">b", -1, CORRUPT_MESSAGE, id="magic-negative"),
        pytest.param(8, ">i", 48, CORRUPT_MESSAGE, id="length-below-header"),
        pytest.param(8, ">i", -5, CORRUPT_MESSAGE, id="length-negative"),
        pytest.param(8, ">i", 2**31 - 1, CORRUPT_MESSAGE, id="length-beyond-buffer"),
    ],
)
def test_structural_checks_and_their_kafka_error_codes(offset: int, fmt: str, value: int, code: int) -> None:
    data = edited(offset, fmt, value)
    with pytest.raises(InvalidBatchError) as info:
        read_header(data, key=KEY)
    assert info.value.error_code == code
    assert_names_place(info.value, KEY, 0)


@pytest.mark.parametrize("count", [0, 2])
def test_fewer_records_than_offsets_is_a_stored_compacted_batch_but_not_a_client_batch(count: int) -> None:
    """Kafka's cleaner leaves batches with fewer records than their offset range (even none); a producer's
    batch must hold exactly one record per offset (LogValidator.validateBatch)."""
    header = read_header(edited(57, ">i", count), key=KEY)
    assert header.record_count == count
    assert client_batch_problem(header) == f"record batch offset range covers 3 offsets but declares {count} records"
    assert client_batch_problem(read_header(simple_batch(3))) is None


def test_truncated_header() -> None:
    data = simple_batch(1)
    for cut in (0, 10, 16, 17, HEADER_SIZE - 1):
        with pytest.raises(InvalidBatchError) as info:
            read_header(data[:cut])
        assert info.value.error_code == CORRUPT_MESSAGE
        assert "truncated" in info.value.reason


@no_deadline
@given(batch_specs(), st.integers(0, 2**63 - 2**32))
def test_set_base_offset_keeps_crc_valid(spec: BatchSpec, new_base: int) -> None:
    data = bytearray(simple_batch(1)) + build_batch(spec)
    pos = len(data) - len(build_batch(spec))
    set_base_offset(memoryview(data), pos, new_base)
    _, (_, header) = split_batches(data)  # verifies both CRCs
    assert header.base_offset == new_base
    ref = decode(data[pos:])
    assert ref.validate_crc()
    assert [record.offset for record in ref] == [new_base + i for i in range(len(spec.records))]


@no_deadline
@given(batch_specs(), st.integers(0, 2**45))
def test_set_log_append_time_matches_what_aiokafka_reads(spec: BatchSpec, now_ms: int) -> None:
    prefix = simple_batch(2)
    data = prefix + build_batch(spec, 5)
    pos = len(prefix)
    before = read_header(data, pos)
    set_log_append_time(data, pos, now_ms)
    after = split_batches(data)[1][1]  # CRC verified
    assert data[:pos] == prefix
    ref = decode(data[pos:])
    assert ref.validate_crc()
    assert ref.timestamp_type == 1 and after.timestamp_type == 1
    assert ref.max_timestamp == after.max_timestamp == now_ms
    got = list(ref)  # aiokafka's batch iterates once
    assert [record.timestamp for record in got] == [now_ms] * len(spec.records)
    assert [record.timestamp_type for record in got] == [1] * len(spec.records)
    # As Kafka: only the timestamp-type bit and maxTimestamp change; baseTimestamp stays as produced.
    assert after.first_timestamp == before.first_timestamp
    assert after.attributes == before.attributes | 0x08
    assert [record.value for record in got] == [record.value for record in spec.records]


def test_set_log_append_time_is_idempotent() -> None:
    data = simple_batch(2)
    set_log_append_time(data, 0, 123_456)
    once = bytes(data)
    set_log_append_time(data, 0, 123_456)
    assert bytes(data) == once


def test_patches_refuse_read_only_buffers() -> None:
    data = bytes(simple_batch(1))
    with pytest.raises(TypeError):
        set_base_offset(memoryview(data), 0, 5)  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", [InvalidBatchError, CorruptSegmentError])
def test_errors_survive_pickling(cls: type[InvalidBatchError]) -> None:
    exc = cls("bad bytes", error_code=INVALID_RECORD, key=KEY, position=99)
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is cls
    assert (back.reason, back.error_code, back.key, back.position) == ("bad bytes", 87, KEY, 99)
    assert str(back) == str(exc) == f"bad bytes (object {KEY!r}, byte 99)"


def test_error_message_without_location() -> None:
    assert str(InvalidBatchError("x")) == "x"
    assert InvalidBatchError("x").error_code == CORRUPT_MESSAGE


def test_header_properties() -> None:
    header = BatchHeader(10, 100, 0, 2, 0, 0x08 | 0x10 | 0x20 | 3, 4, 1, 2, 5, 0, 0, 5)
    assert header.size == 112
    assert header.last_offset == 14
    assert header.compression == 3
    assert header.timestamp_type == 1
    assert header.is_transactional and header.is_control


def test_batch_size_and_count_records_read_the_header_fields() -> None:
    batches = [simple_batch(3), simple_batch(1, base_offset=3), simple_batch(5, codec=1, base_offset=4)]
    data = b"".join(batches)
    assert [batch_size(data, pos) for pos, _ in split_batches(data)] == [len(b) for b in batches]
    assert batch_size(batches[0]) == len(batches[0])
    assert count_records(data) == 9
    assert count_records(data + bytes(HEADER_SIZE - 1)) == 9  # a tail shorter than a header is not a batch
    assert count_records(b"") == 0
