"""Legacy message sets (magic 0 and 1): v2 batches down to them and back (kafscale/storage/legacy_convert.py), their
framings (legacy_codecs.py), and what a damaged or contradictory set is answered with (the codes Apache Kafka 3.9
answers; tests/differential/test_old_protocol.py asks it). Sets are decoded by aiokafka's own legacy reader, an
implementation independent of ours, except lz4 at magic 0, which no installed client library reads."""

from __future__ import annotations

import struct
import zlib

import cramjam
import lz4.frame
import pytest
from aiokafka.record.legacy_records import LegacyRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from hypothesis import given
from hypothesis import strategies as st
from kafka.codec import snappy_decode

from kafscale.storage.batch import CORRUPT_MESSAGE, INVALID_RECORD, InvalidBatchError, read_header
from kafscale.storage.legacy import Record, inner_messages, message_set, read_message, split_entries
from kafscale.storage.legacy_codecs import compress_legacy, decompress_legacy, lz4_frame, xxh32
from kafscale.storage.legacy_convert import INVALID_TIMESTAMP, UnsupportedCodec, down_convert, fit, up_convert
from tests.strategies import BatchSpec, batch_specs, build_batch, decode, no_deadline
from tests.strategies import Record as V2Record

T = 1_700_000_000_000


def legacy_records(data: bytes) -> list[tuple[int, int | None, bytes | None, bytes | None]]:
    """(offset, timestamp, key, value) of every message in a legacy set, by aiokafka's reader."""
    out = []
    records = MemoryRecords(data)
    while (batch := records.next_batch()) is not None:
        out += [(r.offset, r.timestamp, r.key, r.value) for r in batch]
    return out


def own_reader(data: bytes) -> list[tuple[int, int | None, bytes | None, bytes | None]]:
    """The same through our reader: only for lz4 at magic 0 (aiokafka and kafka-python need xxhash for it)."""
    out = []
    for at, size, _ in split_entries(data):
        message = read_message(data, at, size)
        assert message.crc_ok
        for m in inner_messages(message) if message.codec else [message]:
            out.append((m.offset, None if m.magic == 0 else m.timestamp, m.key, m.value))
    return out


def v2_records(data: bytes) -> list[tuple[int, int, bytes | None, bytes | None, tuple[object, ...]]]:
    return [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in decode(data)]


def plain(offset: int, magic: int, timestamp: int, key: bytes | None, value: bytes | None,
          attributes: int = 0) -> bytes:
    """One uncompressed message, written by hand (not by the code under test)."""
    body = struct.pack(">bb", magic, attributes) + (struct.pack(">q", timestamp) if magic else b"")
    for field in (key, value):
        body += struct.pack(">i", -1) if field is None else struct.pack(">i", len(field)) + field
    body = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", offset, len(body)) + body


def wrapper(magic: int, codec: int, inner: bytes, offset: int, timestamp: int = -1, attributes: int = 0,
            payload: bytes | None = None) -> bytes:
    value = compress_legacy(codec, magic, inner) if payload is None else payload
    return plain(offset, magic, timestamp, None, value, codec | attributes)


# ------------------------------------------------------------------------------------------------ round trips


@no_deadline
@given(batch_specs(codecs=(0, 1, 2, 3)), st.integers(0, 2**40), st.sampled_from([0, 1]))
def test_v2_to_legacy_to_v2_keeps_offsets_keys_values_and_timestamps(spec: BatchSpec, base: int,
                                                                     magic: int) -> None:
    batch = bytes(build_batch(spec, base))
    chunks, used = down_convert(batch, magic, base)
    assert used == len(batch) and len(chunks) == 1
    legacy = chunks[0]
    decoded = own_reader(legacy) if (magic, spec.codec) == (0, 3) else legacy_records(legacy)
    assert decoded == [(base + i, None if magic == 0 else r.timestamp, r.key, r.value)
                       for i, r in enumerate(spec.records)]

    back = up_convert(legacy)
    assert read_header(back).compression == spec.codec  # the wrapper's codec is the stored batch's, as in Kafka
    # Offsets restart at 0 (the partition owner assigns them); headers are gone; magic 0 has no timestamps.
    assert v2_records(back) == [(i, -1 if magic == 0 else r.timestamp, r.key, r.value, ())
                                for i, r in enumerate(spec.records)]


messages = st.lists(st.tuples(st.integers(0, 2**41), st.none() | st.binary(max_size=20),
                              st.none() | st.binary(max_size=100)), min_size=1, max_size=12)


@no_deadline
@given(messages, st.sampled_from([(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (1, 3)]), st.integers(0, 2**40))
def test_legacy_set_of_another_writer_survives_up_and_down(rows: list[tuple[int, bytes | None, bytes | None]],
                                                           magic_codec: tuple[int, int], base: int) -> None:
    """Sets written by aiokafka's legacy builder (a wrapper at offset 0 for compressed ones, as librdkafka once
    wrote it) come back, after a stay as v2, as the same messages."""
    magic, codec = magic_codec
    builder = LegacyRecordBatchBuilder(magic, codec, 1 << 30)
    for i, (ts, key, value) in enumerate(rows):
        builder.append(i, timestamp=ts, key=key, value=value)
    built = bytes(builder.build())
    original = legacy_records(built)
    stored = bytearray(up_convert(built))
    struct.pack_into(">q", stored, 0, base)  # what the partition owner does: the base offset is its to give
    chunks, _ = down_convert(bytes(stored), magic, base)
    assert legacy_records(chunks[0]) == [(base + o, ts, k, v) for o, ts, k, v in original]


def test_message_set_writes_what_kafka_writes_for_magic_1() -> None:
    """Byte for byte, a plain message set and a wrapper with relative inner offsets whose offset is the last."""
    records = [Record(7, T, b"k", b"v"), Record(8, T + 5, None, b"w")]
    assert message_set(1, 0, records) == plain(7, 1, T, b"k", b"v") + plain(8, 1, T + 5, None, b"w")
    data = message_set(1, 1, records)
    (at, size, _), = split_entries(data)
    outer = read_message(data, at, size)
    assert (outer.offset, outer.timestamp, outer.key, outer.attributes) == (8, T + 5, None, 1)
    assert decompress_legacy(1, 1, outer.value or b"") == plain(0, 1, T, b"k", b"v") + plain(1, 1, T + 5, None, b"w")
    assert legacy_records(data) == [(7, T, b"k", b"v"), (8, T + 5, None, b"w")]


def test_log_append_time_batches_go_down_with_the_append_time() -> None:
    records = [Record(0, T, b"a", b"1"), Record(1, T + 1, b"b", b"2")]
    uncompressed = message_set(1, 0, records, log_append_time=T + 99)
    assert uncompressed == plain(0, 1, T + 99, b"a", b"1", 0x08) + plain(1, 1, T + 99, b"b", b"2", 0x08)
    compressed = message_set(1, 1, records, log_append_time=T + 99)
    (at, size, _), = split_entries(compressed)
    outer = read_message(compressed, at, size)
    assert (outer.timestamp, outer.attributes) == (T + 99, 0x09)
    assert legacy_records(compressed) == [(0, T + 99, b"a", b"1"), (1, T + 99, b"b", b"2")]
    assert message_set(0, 0, records, log_append_time=T + 99) == plain(0, 0, 0, b"a", b"1") + plain(1, 0, 0, b"b", b"2")


def test_down_conversion_drops_uncompressed_records_below_the_fetch_offset_and_keeps_compressed_ones() -> None:
    rows = tuple(V2Record(T + i, b"k%d" % i, b"v", ()) for i in range(5))
    for codec, first in ((0, 13), (1, 10)):
        batch = bytes(build_batch(BatchSpec(codec, False, -1, -1, -1, rows), 10))
        chunks, _ = down_convert(batch, 1, 13)
        assert [o for o, *_ in legacy_records(chunks[0])] == list(range(first, 15))


def test_down_conversion_skips_control_batches_and_refuses_zstd() -> None:
    data = bytes(build_batch(BatchSpec(0, False, -1, -1, -1, (V2Record(T, None, b"x", ()),)), 0))
    control = bytearray(build_batch(BatchSpec(0, True, 5, 0, 0, (V2Record(T, None, b"\0\0\0\0", ()),)), 1))
    control[22] |= 0x20  # the control bit (the CRC is not checked on this path: the read path did)
    zstd = bytes(build_batch(BatchSpec(4, False, -1, -1, -1, (V2Record(T, None, b"z", ()),)), 2))
    chunks, used = down_convert(data + bytes(control) + zstd, 0, 0)
    assert [legacy_records(c) for c in chunks] == [[(0, None, None, b"x")]]
    assert used == len(data) + len(control)  # stopped before the zstd batch
    with pytest.raises(UnsupportedCodec):
        down_convert(zstd + data, 0, 2)


def test_fit_cuts_or_pads_to_what_kafka_promised() -> None:
    assert fit([], 500) == b""
    assert fit([b"a" * 40, b"b" * 40], 60) == b"a" * 40 + b"b" * 20  # a partial message at the end
    assert fit([b"a" * 90], 30) == b"a" * 90  # never less than the first converted chunk
    padded = fit([b"a" * 10], 40)
    assert padded[:10] == b"a" * 10 and struct.unpack(">qi", padded[10:22]) == (-1, 61) and len(padded) == 40
    assert struct.unpack(">qi", fit([b"a"], 200)[1:13]) == (-1, 200)  # the size points past the end
    big = fit([b"a"], 40_000)  # overflow entries of at most 16 KiB each, as LazyDownConversionRecordsSend
    assert len(big) == 40_000
    assert struct.unpack(">qi", big[1:13]) == (-1, 40_000) and struct.unpack(">qi", big[16385:16397]) == (-1, 23_616)


# ------------------------------------------------------------------------------------------------ what produce refuses


M0 = plain(0, 0, -1, b"k", b"v")
M1 = plain(0, 1, T, b"k", b"v")
INNER0 = plain(0, 0, -1, b"a", b"1") + plain(1, 0, -1, b"b", b"2")
INNER1 = plain(0, 1, T, b"a", b"1") + plain(1, 1, T + 1, b"b", b"2")


def flip(data: bytes, at: int) -> bytes:
    out = bytearray(data)
    out[at] ^= 0xFF
    return bytes(out)


def resealed(data: bytes) -> bytes:
    """A single message whose CRC was recomputed after an edit (to reach the checks behind the CRC)."""
    out = bytearray(data)
    struct.pack_into(">I", out, 12, zlib.crc32(out[16:]))
    return bytes(out)


V2 = bytes(build_batch(BatchSpec(0, False, -1, -1, -1, (V2Record(T, b"k", b"v", ()),)), 0))

# (records, code): the code Apache Kafka 3.9.2 answers Produce v0-v2 with, except where it fails with an exception
# it did not expect (UNKNOWN_SERVER_ERROR): those are marked, and listed in docs/compatibility.md.
REFUSED = {
    "bad CRC": (flip(M0, 20), CORRUPT_MESSAGE),
    "bad CRC in the second message": (M1 + flip(M1, 30), CORRUPT_MESSAGE),
    "size below the smallest message": (M0 + struct.pack(">qi", 0, 13) + b"\0" * 13, CORRUPT_MESSAGE),
    "magic 3": (resealed(M0[:16] + b"\x03" + M0[17:]), CORRUPT_MESSAGE),
    "two wrappers": (wrapper(1, 1, INNER1, 1) * 2, INVALID_RECORD),
    "a wrapper and a plain message": (wrapper(1, 1, INNER1, 1) + M1, INVALID_RECORD),
    "magic 0 then magic 1": (M0 + M1, INVALID_RECORD),
    "magic 1 then a v2 batch": (M1 + V2, INVALID_RECORD),
    "a v2 batch then magic 1": (V2 + M1, INVALID_RECORD),
    "LogAppendTime claimed without a timestamp": (plain(0, 1, -1, b"k", b"v", 0x08), INVALID_TIMESTAMP),
    "a LogAppendTime wrapper without a timestamp": (wrapper(1, 1, INNER1, 1, -1, 0x08), INVALID_TIMESTAMP),
    "inner CRC": (wrapper(1, 1, flip(INNER1, 30), 1), CORRUPT_MESSAGE),
    "inner compressed": (wrapper(1, 1, wrapper(1, 1, INNER1, 1), 0), INVALID_RECORD),
    "inner magic 0 in a magic 1 wrapper": (wrapper(1, 1, INNER0, 1), INVALID_RECORD),
    "wrapper offset below the last inner": (wrapper(1, 1, plain(0, 1, T, None, b"1") + plain(5, 1, T, None, b"2"), 3),
                                            INVALID_RECORD),
    "zstd wrapper": (plain(0, 1, T, None, b"xx", 4), INVALID_RECORD),
    "null wrapper value": (plain(0, 1, T, None, None, 1), INVALID_RECORD),
    "no inner message": (wrapper(1, 1, b"", 0), INVALID_RECORD),
    "only a partial inner message": (wrapper(1, 1, INNER1[:10], 0), INVALID_RECORD),
    # Kafka: UNKNOWN_SERVER_ERROR for these.
    "codec 5": (plain(0, 1, T, None, b"xx", 5), INVALID_RECORD),
    "gzip that is not": (wrapper(1, 1, INNER1, 1, payload=b"not gzip at all"), CORRUPT_MESSAGE),
    "magic 1 lz4 with the pre-0.10 header checksum": (wrapper(1, 3, INNER1, 1, payload=lz4_frame(INNER1, True)),
                                                       CORRUPT_MESSAGE),
    "negative timestamp": (plain(0, 1, -5, b"k", b"v"), INVALID_TIMESTAMP),
    "key longer than the message": (resealed(M0[:22] + b"\0\0\0\x50" + M0[26:]), CORRUPT_MESSAGE),
    "magic 1 without room for its timestamp": (resealed(plain(0, 0, -1, None, None)[:16] + b"\x01" +
                                                        plain(0, 0, -1, None, None)[17:]), CORRUPT_MESSAGE),
}


@pytest.mark.parametrize("name", REFUSED)
def test_refused_message_sets_get_kafkas_code(name: str) -> None:
    records, code = REFUSED[name]
    with pytest.raises(InvalidBatchError) as caught:
        up_convert(records)
    assert caught.value.error_code == code, caught.value


@pytest.mark.parametrize(("records", "expected"), [
    (b"", []),
    (M0[:20], []),  # no whole message: Kafka appends nothing and says so with base offset -1
    (M0 + M0[:20], [(0, -1, b"k", b"v")]),  # a partial message at the end is left out, as Kafka does
    (plain(0, 1, T, b"k", b"v", 0x08), [(0, T, b"k", b"v")]),  # a claimed LogAppendTime with a time: CreateTime
    (wrapper(1, 1, INNER1, 99, T + 7, 0x08), [(0, T + 7, b"a", b"1"), (1, T + 7, b"b", b"2")]),
    (wrapper(0, 3, INNER0, 1), [(0, -1, b"a", b"1"), (1, -1, b"b", b"2")]),  # lz4, pre-0.10 header checksum
    (wrapper(0, 3, INNER0, 1, payload=lz4_frame(INNER0, False)), [(0, -1, b"a", b"1"), (1, -1, b"b", b"2")]),
    (M0 + b"\0" * 11, [(0, -1, b"k", b"v")]),  # fewer than 12 bytes left: not even a partial entry
    (V2, [(0, T, b"k", b"v")]),  # a v2 batch below Produce v3: Kafka does not check the magic there
])
def test_accepted_message_sets(records: bytes, expected: list[tuple[int, int, bytes, bytes]]) -> None:
    converted = up_convert(records)
    if expected:
        assert [r[:4] for r in v2_records(converted)] == expected
    else:
        assert converted == b""


def test_log_append_time_topics_refuse_a_claimed_log_append_time_and_take_the_rest() -> None:
    with pytest.raises(InvalidBatchError) as caught:
        up_convert(plain(0, 1, T, b"k", b"v", 0x08), log_append_time=True)
    assert caught.value.error_code == INVALID_TIMESTAMP
    assert [r[:4] for r in v2_records(up_convert(M1, log_append_time=True))] == [(0, T, b"k", b"v")]


def test_messages_larger_than_max_message_bytes_are_refused_before_their_crc() -> None:
    with pytest.raises(InvalidBatchError) as caught:
        up_convert(flip(M0, 20), max_message_bytes=len(M0) - 1)
    assert caught.value.error_code == 10  # MESSAGE_TOO_LARGE
    assert up_convert(M0, max_message_bytes=len(M0))


def test_every_byte_flip_behind_the_size_is_refused_and_offset_flips_change_nothing() -> None:
    """The CRC covers every byte after itself; offsets of a producer's messages are not the broker's to keep."""
    data = M1 + plain(1, 1, T, None, b"value")
    expected = up_convert(data)
    for at in range(len(data)):
        within = at if at < len(M1) else at - len(M1)
        if within < 8:
            assert up_convert(flip(data, at)) == expected
        elif within >= 12:
            with pytest.raises(InvalidBatchError):
                up_convert(flip(data, at))


def test_a_cut_set_keeps_its_whole_messages() -> None:
    data = M0 + plain(1, 0, -1, None, b"second") + M0
    ends = [len(M0), len(M0) + len(plain(1, 0, -1, None, b"second")), len(data)]
    for cut in range(len(data) + 1):
        converted = up_convert(data[:cut])
        assert (len(v2_records(converted)) if converted else 0) == sum(1 for end in ends if end <= cut)


# ------------------------------------------------------------------------------------------------ framings


def test_xxh32_against_published_values() -> None:
    assert (xxh32(b""), xxh32(b"a"), xxh32(b"abc")) == (0x02CC5D05, 0x550D7456, 0x32D153FF)


@pytest.mark.parametrize("size", [0, 1, 1000, 65_536, 200_003])
def test_lz4_frames_are_kafkas(size: int) -> None:
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    good, broken = lz4_frame(data, False), lz4_frame(data, True)
    assert good[4:6] == b"\x60\x40"  # independent 64 KiB blocks, no checksums: KafkaLZ4BlockOutputStream
    assert lz4.frame.decompress(good) == data  # an independent reader checks the header checksum
    assert broken[6] == (xxh32(b"\x04\x22\x4d\x18\x60\x40") >> 8) & 0xFF  # the pre-0.10 HC covers the magic too
    assert decompress_legacy(3, 0, broken) == decompress_legacy(3, 0, good) == decompress_legacy(3, 1, good) == data
    assert compress_legacy(3, 0, data) == broken and compress_legacy(3, 1, data) == good


def test_snappy_is_xerial_framed_and_raw_snappy_reads_too() -> None:
    data = b"kafka " * 10_000
    framed = compress_legacy(2, 1, data)
    assert framed.startswith(b"\x82SNAPPY\x00") and snappy_decode(framed) == data  # kafka-python reads it
    assert decompress_legacy(2, 0, framed) == data
    assert decompress_legacy(2, 1, bytes(cramjam.snappy.compress_raw(data))) == data  # librdkafka's raw snappy


@no_deadline
@given(st.sampled_from([M0 + M1, wrapper(1, 1, INNER1, 1), wrapper(0, 2, INNER0, 1), wrapper(0, 3, INNER0, 1),
                        wrapper(1, 3, INNER1, 1), V2]),
       st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6), st.booleans(),
       st.binary(max_size=64))
def test_no_bytes_make_the_conversion_fail_otherwise_than_with_a_kafka_code(
        base: bytes, edits: list[tuple[int, int]], reseal: bool, tail: bytes) -> None:
    """Damage anywhere, CRCs recomputed or not (so the damage reaches the decompressors and parsers behind them):
    an answer with a code, never another exception (which would close the client's connection)."""
    data = bytearray(base)
    for at, value in edits:
        data[at % len(data)] = value
    if reseal and len(data) > 16:
        struct.pack_into(">I", data, 12, zlib.crc32(data[16:]))
    try:
        up_convert(bytes(data) + tail)
    except InvalidBatchError as e:
        assert e.error_code in (CORRUPT_MESSAGE, INVALID_RECORD, INVALID_TIMESTAMP, 10)
