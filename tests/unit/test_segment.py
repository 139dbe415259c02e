"""Segment objects: round trips, slicing, and that no damaged byte is ever accepted. Also object keys."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from kafscale.storage.batch import CORRUPT_MESSAGE, InvalidBatchError, set_base_offset
from kafscale.storage.index import SegmentIndex
from kafscale.storage.keys import SegmentKey, index_key, parse_segment_key, partition_prefix, segment_key
from kafscale.storage.segment import (
    SEGMENT_FOOTER_SIZE,
    SEGMENT_HEADER_SIZE,
    CorruptSegmentError,
    SegmentReader,
    batches_region,
    build_segment,
    parse_segment_footer,
    parse_segment_header,
)
from tests.strategies import BatchSpec, Record, build_batch, contiguous_batches, decode, no_deadline

KEY = "prod/eu/orders.v2/3/segment-00000000000000000100.kfs"


def small_segment() -> tuple[bytes, list[bytearray]]:
    """Three batches (plain, gzip, zstd) at offsets 100..105."""
    batches = []
    offset = 100
    for codec, count in ((0, 2), (1, 3), (4, 1)):
        spec = BatchSpec(
            codec=codec,
            transactional=False,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            records=tuple(Record(5_000 + offset + i, b"key", b"value-%d" % i, ()) for i in range(count)),
        )
        batches.append(build_batch(spec, offset))
        offset += count
    return build_segment(batches, created_ms=1_700_000_000_000).data, batches


def assert_corruption_reported(data: bytes | bytearray, key: str = KEY) -> CorruptSegmentError:
    with pytest.raises(CorruptSegmentError) as info:
        SegmentReader(data, key=key)
    exc = info.value
    assert isinstance(exc, InvalidBatchError)
    assert exc.error_code == CORRUPT_MESSAGE
    assert exc.key == key and repr(key) in str(exc)
    assert exc.position is not None and 0 <= exc.position <= len(data)
    assert f"byte {exc.position}" in str(exc)
    return exc


@no_deadline
@given(contiguous_batches(), st.integers(0, 2**45), st.integers(1, 5))
def test_round_trip(drawn: tuple[int, list[BatchSpec], list[bytearray]], created: int, group: int) -> None:
    base, specs, batches = drawn
    # Pass some batches joined together, as a produce request's record set would arrive.
    items = [b"".join(batches[i : i + group]) for i in range(0, len(batches), group)]
    built = build_segment(items, created_ms=created, index_interval_bytes=200)
    reader = SegmentReader(built.data, key=KEY)

    total = sum(len(spec.records) for spec in specs)
    stamps = [max(r.timestamp for r in spec.records) for spec in specs]
    assert reader.info == built.info
    info = reader.info
    assert (info.base_offset, info.last_offset, info.record_count) == (base, base + total - 1, total)
    assert (info.batch_count, info.size, info.created_ms) == (len(batches), len(built.data), created)
    assert (info.min_timestamp, info.max_timestamp) == (min(stamps), max(stamps))
    assert info.crc == crc32c(b"".join(batches))

    got = [bytes(reader.batch_bytes(pos, header)) for pos, header in reader.batches()]
    assert got == [bytes(b) for b in batches]
    assert built.data[SEGMENT_HEADER_SIZE:-SEGMENT_FOOTER_SIZE] == b"".join(batches)
    assert parse_segment_header(built.data) == (base, total, created, False)
    assert parse_segment_footer(built.data) == (info.crc, info.last_offset)

    # Records decode with aiokafka straight out of the object.
    first_pos, first_header = next(reader.batches())
    assert [r.offset for r in decode(reader.batch_bytes(first_pos, first_header))] == [
        base + i for i in range(len(specs[0].records))
    ]

    # Every index entry points at a batch start of the object.
    index = SegmentIndex.parse(built.index, key=KEY)
    starts = {pos: header.base_offset for pos, header in reader.batches()}
    assert all(starts[entry.position] == entry.offset for entry in index.entries)


def test_slice_from_returns_whole_batches() -> None:
    data, batches = small_segment()
    reader = SegmentReader(data)
    sizes = [len(b) for b in batches]
    offsets = [(100, 0), (101, 0), (102, 1), (104, 1), (105, 2)]
    for offset, batch_index in offsets:
        start = SEGMENT_HEADER_SIZE + sum(sizes[:batch_index])
        view = reader.slice_from(offset)
        assert bytes(view) == data[start:-SEGMENT_FOOTER_SIZE]
        # One batch even when it is larger than max_bytes (Kafka's progress guarantee).
        assert bytes(reader.slice_from(offset, max_bytes=1)) == bytes(batches[batch_index])
        # As many whole batches as fit.
        fit = sizes[batch_index] + (sizes[batch_index + 1] if batch_index + 1 < len(sizes) else 0)
        assert len(reader.slice_from(offset, max_bytes=fit)) == fit
        assert len(reader.slice_from(offset, max_bytes=fit - 1)) == sizes[batch_index]
    for outside in (99, 106):
        with pytest.raises(ValueError):
            reader.slice_from(outside)


def test_build_rejects_gaps_overlaps_and_nothing() -> None:
    _, batches = small_segment()
    with pytest.raises(ValueError, match="expected 102"):
        build_segment([batches[0], batches[2]], created_ms=0)
    with pytest.raises(ValueError, match="expected 102"):
        build_segment([batches[0], batches[0]], created_ms=0)
    with pytest.raises(ValueError):
        build_segment([], created_ms=0)
    with pytest.raises(ValueError):
        build_segment([b""], created_ms=0)
    unassigned = bytearray(batches[0])
    set_base_offset(unassigned, 0, -1)
    with pytest.raises(ValueError, match="negative base offset"):
        build_segment([unassigned], created_ms=0)


def test_build_refuses_a_batch_damaged_in_memory() -> None:
    _, batches = small_segment()
    batches[1][-1] ^= 1
    with pytest.raises(InvalidBatchError) as info:
        build_segment(batches, created_ms=0)
    assert info.value.position == SEGMENT_HEADER_SIZE + len(batches[0])


def test_index_interval_in_records() -> None:
    _, batches = small_segment()
    built = build_segment(batches, created_ms=0, index_interval_records=2)
    index = SegmentIndex.parse(built.index)
    assert index.interval_unit == "records" and index.interval == 2
    assert [e.offset for e in index.entries] == [100, 102, 105]


def test_every_flipped_byte_is_reported() -> None:
    """No region of a segment is unchecked: header (magic, version, flags, base offset, record count,
    created ms, header CRC), each batch's header and body, and the footer."""
    data, _ = small_segment()
    for i in range(len(data)):
        for mask in (0x01, 0x80, 0xFF):
            damaged = bytearray(data)
            damaged[i] ^= mask
            assert_corruption_reported(damaged)


@no_deadline
@given(st.data())
def test_random_flip_is_reported(data: st.DataObject) -> None:
    segment, _ = small_segment()
    i = data.draw(st.integers(0, len(segment) - 1))
    mask = data.draw(st.integers(1, 255))
    damaged = bytearray(segment)
    damaged[i] ^= mask
    assert_corruption_reported(damaged)


def test_every_truncation_is_reported() -> None:
    """Every length, which includes every region boundary: inside and at the end of the header, at and
    inside each batch, and inside the footer."""
    data, _ = small_segment()
    for cut in range(len(data)):
        assert_corruption_reported(data[:cut])
    assert_corruption_reported(data + b"\x00")


def test_specific_damage_names_the_right_place() -> None:
    data, batches = small_segment()
    size = len(data)
    second = SEGMENT_HEADER_SIZE + len(batches[0])

    damaged = bytearray(data)
    damaged[0:4] = b"KAFZ"
    exc = assert_corruption_reported(damaged)
    assert exc.position == 0 and "magic" in exc.reason

    damaged = bytearray(data)
    damaged[-4:] = b"END?"
    exc = assert_corruption_reported(damaged)
    assert exc.position == size - 4 and "footer magic" in exc.reason

    damaged = bytearray(data)
    damaged[size - SEGMENT_FOOTER_SIZE] ^= 0x01
    exc = assert_corruption_reported(damaged)
    assert exc.position == size - SEGMENT_FOOTER_SIZE and "footer CRC32C" in exc.reason

    damaged = bytearray(data)
    damaged[second + 30] ^= 0x01  # inside the second batch's CRC-covered header
    exc = assert_corruption_reported(damaged)
    assert exc.position == second and "CRC32C" in exc.reason

    damaged = bytearray(data)
    damaged[second + 13] ^= 0x01  # leader epoch: outside Kafka's CRC, inside the footer's
    exc = assert_corruption_reported(damaged)
    assert exc.position == size - SEGMENT_FOOTER_SIZE

    damaged = bytearray(data)
    set_base_offset(damaged, second, 999)  # outside Kafka's CRC: caught by offset continuity
    exc = assert_corruption_reported(damaged)
    assert exc.position == second and "offset" in exc.reason

    damaged = bytearray(data)
    damaged[20] ^= 0x01  # created ms: covered by the header CRC
    exc = assert_corruption_reported(damaged)
    assert exc.position == 28 and "header CRC32C" in exc.reason


def test_seed_layout_header_without_crc_is_read() -> None:
    """A header with flags 0 (the seed's and the Go Kafscale's layout) keeps reserved = 0 and has no
    header CRC. Such segments are readable; their created-ms field is the one byte range no check can
    cover, which is harmless because nothing decides anything by it (retention uses batch timestamps).
    Our writer always sets the flag, so this only concerns segments written elsewhere."""
    data, _ = small_segment()
    legacy = bytearray(data)
    struct.pack_into(">HqiqI", legacy, 6, 0, 100, 6, 1_700_000_000_000, 0)
    reader = SegmentReader(legacy, key=KEY)
    assert reader.info.created_ms == 1_700_000_000_000
    struct.pack_into(">q", legacy, 20, 42)
    assert SegmentReader(legacy).info.created_ms == 42
    struct.pack_into(">I", legacy, 28, 7)  # reserved must stay zero
    assert assert_corruption_reported(legacy).position == 28


def test_unknown_flags_and_versions_are_refused() -> None:
    data, _ = small_segment()
    for offset, fmt, value in ((6, ">H", 0x0005), (4, ">H", 2)):
        damaged = bytearray(data)
        struct.pack_into(fmt, damaged, offset, value)
        struct.pack_into(">I", damaged, 28, crc32c(bytes(damaged[:28])))
        assert assert_corruption_reported(damaged).position == offset


def test_consistent_looking_counts_are_still_checked() -> None:
    data, _ = small_segment()
    damaged = bytearray(data)
    struct.pack_into(">i", damaged, 16, 7)
    struct.pack_into(">I", damaged, 28, crc32c(bytes(damaged[:28])))
    assert assert_corruption_reported(damaged).position == 16

    damaged = bytearray(data)
    struct.pack_into(">q", damaged, len(data) - 12, 106)
    assert assert_corruption_reported(damaged).position == len(data) - 12


def test_verify_false_skips_only_the_crcs() -> None:
    data, _ = small_segment()
    damaged = bytearray(data)
    damaged[-SEGMENT_FOOTER_SIZE - 1] ^= 0x01  # last byte of the last batch's body
    assert SegmentReader(damaged, verify=False).info.record_count == 6
    damaged[-4:] = b"XXXX"
    with pytest.raises(CorruptSegmentError):
        SegmentReader(damaged, verify=False)


def test_reader_accepts_bytes_bytearray_and_memoryview() -> None:
    data, _ = small_segment()
    infos = {SegmentReader(buf).info for buf in (data, bytearray(data), memoryview(data))}
    assert len(infos) == 1


def test_footer_from_a_ranged_get_of_the_tail() -> None:
    data, _ = small_segment()
    tail = data[-SEGMENT_FOOTER_SIZE:]
    assert parse_segment_footer(tail) == parse_segment_footer(data)
    broken = tail[:-1] + b"?"
    with pytest.raises(CorruptSegmentError) as info:
        parse_segment_footer(broken, KEY, object_size=len(data))
    assert info.value.position == len(data) - 4
    with pytest.raises(CorruptSegmentError):
        parse_segment_footer(tail[:10], KEY)


def test_header_from_a_ranged_get_of_the_head() -> None:
    data, _ = small_segment()
    header = parse_segment_header(data[:SEGMENT_HEADER_SIZE], KEY)
    assert header.base_offset == 100 and header.record_count == 6
    with pytest.raises(CorruptSegmentError):
        parse_segment_header(data[:31], KEY)


def test_batches_region() -> None:
    assert batches_region(1_000) == (32, 984)
    with pytest.raises(ValueError):
        batches_region(47)


# --- object keys -------------------------------------------------------------------------------------


@no_deadline
@given(
    st.lists(st.from_regex(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,8}", fullmatch=True), min_size=1, max_size=3),
    st.from_regex(r"[A-Za-z0-9._-]{1,40}", fullmatch=True).filter(lambda t: t not in (".", "..")),
    st.integers(0, 2**31 - 1),
    st.integers(0, 2**63 - 1),
)
def test_keys_round_trip(ns_parts: list[str], topic: str, partition: int, base: int) -> None:
    namespace = "/".join(ns_parts)
    kfs = segment_key(namespace, topic, partition, base)
    idx = index_key(namespace, topic, partition, base)
    assert kfs.startswith(partition_prefix(namespace, topic, partition))
    assert parse_segment_key(kfs) == SegmentKey(namespace, topic, partition, base, "kfs")
    assert parse_segment_key(idx) == SegmentKey(namespace, topic, partition, base, "index")
    assert idx == kfs[: -len("kfs")] + "index"


def test_epoch_variant_keys_round_trip() -> None:
    kfs = segment_key("ns", "t", 3, 50, epoch=7)
    assert kfs == "ns/t/3/segment-00000000000000000050-e7.kfs"
    assert parse_segment_key(kfs) == SegmentKey("ns", "t", 3, 50, "kfs", 7)
    assert parse_segment_key(index_key("ns", "t", 3, 50, epoch=7)) == SegmentKey("ns", "t", 3, 50, "index", 7)
    assert parse_segment_key("ns/t/3/segment-00000000000000000050-e0.kfs") is None  # epoch 0 is the plain key
    assert parse_segment_key("ns/t/3/segment-00000000000000000050-e07.kfs") is None


def test_key_layout_and_listing_order() -> None:
    assert segment_key("production", "orders", 0, 50_000) == (
        "production/orders/0/segment-00000000000000050000.kfs"
    )
    assert index_key("production", "orders", 0, 0) == "production/orders/0/segment-00000000000000000000.index"
    assert partition_prefix("a/b", "t.x_y-z", 12) == "a/b/t.x_y-z/12/"
    bases = [0, 9, 10, 99_999, 100_000, 2**63 - 1]
    keys = [segment_key("ns", "t", 0, b) for b in bases]
    assert sorted(keys) == keys


@pytest.mark.parametrize(
    "key",
    [
        "ns/t/0/segment-0000000000000000000.kfs",  # 19 digits
        "ns/t/0/segment-00000000000000000000.log",
        "ns/t/01/segment-00000000000000000000.kfs",  # non-canonical partition
        "ns/t/-1/segment-00000000000000000000.kfs",
        "ns/t/2147483648/segment-00000000000000000000.kfs",
        "ns/t/0/segment-99999999999999999999.kfs",  # beyond i64
        "ns/t!/0/segment-00000000000000000000.kfs",
        "ns/../0/segment-00000000000000000000.kfs",
        "t/0/segment-00000000000000000000.kfs",  # no namespace
        "a//t/0/segment-00000000000000000000.kfs",
        "__health/startup_probe_1700000000",
        "",
    ],
)
def test_foreign_keys_are_not_segments(key: str) -> None:
    assert parse_segment_key(key) is None


@pytest.mark.parametrize(
    ("namespace", "topic", "partition", "base"),
    [
        ("", "t", 0, 0),
        ("a/", "t", 0, 0),
        ("ns", "a/b", 0, 0),
        ("ns", "..", 0, 0),
        ("ns", "t" * 250, 0, 0),
        ("ns", "t", -1, 0),
        ("ns", "t", 0, -1),
        ("ns", "t", 0, 2**63),
    ],
)
def test_illegal_key_parts_are_refused(namespace: str, topic: str, partition: int, base: int) -> None:
    with pytest.raises(ValueError):
        segment_key(namespace, topic, partition, base)


def compacted_segment() -> bytes:
    """A compacted segment over offsets 90..120 whose batches hold 100..101 and 105 (gaps before, between and
    after them), the middle batch of the three removed."""
    _, batches = small_segment()
    return build_segment([batches[0], batches[2]], created_ms=1, span=(90, 120)).data


def test_a_compacted_segment_keeps_its_span_and_reads_across_its_gaps() -> None:
    data = compacted_segment()
    reader = SegmentReader(data, key=KEY)
    assert (reader.info.base_offset, reader.info.last_offset, reader.info.record_count) == (90, 120, 3)
    assert parse_segment_header(data).compacted
    first, second = [bytes(reader.batch_bytes(p, h)) for p, h in reader.batches()]
    assert bytes(reader.slice_from(90)) == first + second  # before the first batch: from the first
    assert bytes(reader.slice_from(101)) == first + second
    assert bytes(reader.slice_from(102)) == second  # in the gap: the next batch, not the one below it
    assert bytes(reader.slice_from(106)) == b""  # nothing left at or after 106 here: the reader moves on
    assert bytes(reader.slice_from(120)) == b""


def test_a_compacted_segment_still_refuses_batches_out_of_order_or_outside_its_span() -> None:
    _, batches = small_segment()
    with pytest.raises(ValueError, match=r"105\.\.105, outside 102\.\.104"):
        build_segment([batches[0], batches[2]], created_ms=1, span=(90, 104))
    with pytest.raises(ValueError, match=r"100\.\.101, outside 106\.\.120"):
        build_segment([batches[2], batches[0]], created_ms=1, span=(90, 120))
    data = bytearray(compacted_segment())  # the footer's last offset below the last batch
    struct.pack_into(">q", data, len(data) - 12, 104)
    assert assert_corruption_reported(data).position == len(data) - 12
    plain = bytearray(build_segment([batches[0], batches[2]], created_ms=1, span=(90, 120)).data)
    struct.pack_into(">H", plain, 6, 0x0001)  # without the flag the gaps are damage
    struct.pack_into(">I", plain, 28, crc32c(bytes(plain[:28])))
    assert "expected 90" in str(assert_corruption_reported(plain))
