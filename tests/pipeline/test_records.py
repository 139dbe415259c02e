"""The vectorised record decoder against aiokafka's reference decoder, for every codec, and on bad input."""

from __future__ import annotations

import random

import pytest
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from kafscale.pipeline.records import KAFKA_ARROW_SCHEMA, decode_batches
from kafscale.storage.batch import CorruptSegmentError, set_base_offset, set_log_append_time, split_batches


def build(codec: int, base: int, count: int, rng: random.Random) -> bytes:
    builder = DefaultRecordBatchBuilder(2, codec, 0, -1, -1, -1, 1 << 30)
    for i in range(count):
        key = None if rng.random() < 0.2 else rng.randbytes(rng.choice([0, 3, 12, 13, 40]))
        value = None if rng.random() < 0.1 else rng.randbytes(rng.choice([0, 1, 12, 13, 100, 5000]))
        headers = [(f"h{j}é", None if rng.random() < 0.3 else rng.randbytes(rng.randint(0, 20)))
                   for j in range(rng.randint(0, 3))]
        builder.append(i, 1_700_000_000_000 + rng.randint(-5, 1000), key, value, headers)
    buf = bytearray(builder.build())
    set_base_offset(buf, 0, base)
    return bytes(buf)


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4], ids=["none", "gzip", "snappy-xerial", "lz4", "zstd"])
def test_decoded_columns_equal_aiokafka_records(codec: int) -> None:
    rng = random.Random(codec)
    raws, base = [], 10
    for _ in range(8):
        count = rng.randint(1, 60)
        raws.append(build(codec, base, count, rng))
        base += count
    batches = [(raw, header) for raw in raws for _, header in split_batches(raw)]
    got = decode_batches(batches, "orders", 3, start_offset=12, end_offset=base - 2)
    assert got.schema.equals(KAFKA_ARROW_SCHEMA)
    expected = [(r.key, r.value, r.offset, r.timestamp * 1000, [(k, v) for k, v in r.headers])
                for raw in raws for r in DefaultRecordBatch(raw) if 12 <= r.offset < base - 2]
    rows = got.to_pylist()
    micros = got.column("timestamp").cast("int64").to_pylist()
    assert [(r["key"], r["value"], r["offset"], ts, [(h["key"], h["value"]) for h in r["headers"] or []])
            for r, ts in zip(rows, micros, strict=True)] == expected
    # As in Spark's Kafka source, a record without headers has null headers, not an empty list.
    assert [r["headers"] is None for r in rows] == [not h for *_, h in expected]
    assert any(r["headers"] is None for r in rows) and any(r["headers"] for r in rows)
    assert {(r["topic"], r["partition"], r["timestampType"]) for r in rows} == {("orders", 3, 0)}


def test_log_append_time_gives_every_record_the_batch_time() -> None:
    raw = bytearray(build(0, 0, 20, random.Random(1)))
    set_log_append_time(raw, 0, 1_800_000_000_123)
    got = decode_batches([(bytes(raw), split_batches(raw)[0][1])], "t", 0)
    assert set(got.column("timestamp").cast("int64").to_pylist()) == {1_800_000_000_123_000}
    assert set(got.column("timestampType").to_pylist()) == {1}


def test_malformed_records_under_a_valid_crc_are_refused() -> None:
    raw = bytearray(build(0, 0, 5, random.Random(2)))
    raw[61] = 0x7E  # first record's length prefix now claims 63 bytes; the chain no longer fits the batch
    header = split_batches(raw, verify_crc=False)[0][1]
    with pytest.raises(CorruptSegmentError, match="seg-key"):
        decode_batches([(bytes(raw), header)], "t", 0, key="seg-key")
