"""Hypothesis strategies and helpers for the storage-format tests.

Batches are made by aiokafka's own v2 builder, so the tests check our parser against an independent
implementation of the format (including compressed batches) rather than against itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from crc32c import crc32c
from hypothesis import settings
from hypothesis import strategies as st

from kafscale.storage.batch import ATTRIBUTES_OFFSET, CRC_OFFSET, set_base_offset

CODECS = (0, 1, 2, 3, 4)  # none, gzip, snappy, lz4, zstd

# A codec's first use (library and table set-up) and a loaded CI machine make per-example timings noisy;
# these tests are about correctness, so Hypothesis' 200 ms deadline would only produce flakes.
no_deadline = settings(deadline=None)


@dataclass(frozen=True)
class Record:
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True)
class BatchSpec:
    codec: int
    transactional: bool
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: tuple[Record, ...]


def build_batch(spec: BatchSpec, base_offset: int = 0) -> bytearray:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=spec.codec,
        is_transactional=int(spec.transactional),
        producer_id=spec.producer_id,
        producer_epoch=spec.producer_epoch,
        base_sequence=spec.base_sequence,
        batch_size=1 << 30,
    )
    for delta, record in enumerate(spec.records):
        meta = builder.append(
            delta,
            timestamp=record.timestamp,
            key=record.key,
            value=record.value,
            headers=list(record.headers),
        )
        assert meta is not None
    data = builder.build()
    set_base_offset(data, 0, base_offset)
    return data


def decode(data: bytes | bytearray | memoryview) -> DefaultRecordBatch:
    return DefaultRecordBatch(bytes(data))


def reseal(data: bytearray, pos: int = 0) -> None:
    """Recompute a batch's CRC after a test edited a covered field (to reach checks behind the CRC)."""
    end = pos + 12 + int.from_bytes(data[pos + 8 : pos + 12], "big", signed=True)
    crc = crc32c(bytes(data[pos + ATTRIBUTES_OFFSET : end]))
    data[pos + CRC_OFFSET : pos + CRC_OFFSET + 4] = crc.to_bytes(4, "big")


records = st.builds(
    Record,
    timestamp=st.integers(0, 2**41),
    key=st.none() | st.binary(max_size=24),
    value=st.none() | st.binary(max_size=200),
    headers=st.lists(st.tuples(st.text(max_size=6), st.binary(max_size=12)), max_size=2).map(tuple),
)


@st.composite
def batch_specs(draw: st.DrawFn, *, max_records: int = 12, codecs: tuple[int, ...] = CODECS) -> BatchSpec:
    idempotent = draw(st.booleans())
    return BatchSpec(
        codec=draw(st.sampled_from(codecs)),
        transactional=idempotent and draw(st.booleans()),
        producer_id=draw(st.integers(0, 2**40)) if idempotent else -1,
        producer_epoch=draw(st.integers(0, 2**15 - 1)) if idempotent else -1,
        base_sequence=draw(st.integers(0, 2**31 - 1)) if idempotent else -1,
        records=tuple(draw(st.lists(records, min_size=1, max_size=max_records))),
    )


@st.composite
def contiguous_batches(
    draw: st.DrawFn, *, max_batches: int = 6, max_records: int = 8
) -> tuple[int, list[BatchSpec], list[bytearray]]:
    """A base offset and batches whose offsets follow on from it without gaps."""
    base = draw(st.integers(0, 2**40))
    specs = draw(st.lists(batch_specs(max_records=max_records), min_size=1, max_size=max_batches))
    out = []
    offset = base
    for spec in specs:
        out.append(build_batch(spec, offset))
        offset += len(spec.records)
    return base, specs, out
