"""The proxy's record work (kafscale.proxy.records) and its translation tables, as properties: whatever a client
produces, tagged, comes back to it whole from its own virtual partition only; a client's position always
reaches the end of what was fetched. kafka-python's record reader is the independent judge of every batch."""

from __future__ import annotations

import asyncio
import struct

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from kafscale.proxy.producers import ProducerIds
from kafscale.proxy.records import TAG, Lanes, TagError, keep_lane, skip_batch, tag
from kafscale.proxy.topics import offsets_topic, offsets_topic_of, rounds
from kafscale.storage.batch import InvalidBatchError, set_base_offset

Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]
records_st = st.lists(st.tuples(st.none() | st.binary(max_size=20), st.none() | st.binary(max_size=40),
                                st.lists(st.tuples(st.sampled_from([TAG.decode()]) | st.text(max_size=8),
                                                   st.sampled_from([b"13", b"999", b"x"]) | st.binary(max_size=8)),
                                         max_size=2)),
                      min_size=1, max_size=6)


def client_batch(records: list[Record], codec: int = 0, producer: tuple[int, int, int] = (-1, -1, -1)) -> bytes:
    pid, epoch, seq = producer
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False, producer_id=pid,
                                        producer_epoch=epoch, base_sequence=seq, batch_size=1 << 20)
    for i, (key, value, headers) in enumerate(records):
        assert builder.append(i, timestamp=1_700_000_000_000 + i, key=key, value=value, headers=headers)
    return bytes(builder.build())


@settings(max_examples=60, deadline=None)
@given(records_st, st.sampled_from([0, 1, 2, 3, 4]), st.integers(0, 99), st.booleans())
def test_a_tagged_batch_keeps_every_record_and_names_its_virtual_partition(records: list[Record], codec: int,
                                                                           lane: int, idempotent: bool) -> None:
    produced = client_batch(records, codec, (41, 3, 17) if idempotent else (-1, -1, -1))
    tagged = tag(produced, lane, (900 + lane, 0) if idempotent else None)
    batch = MemoryRecords(tagged).next_batch()
    client = MemoryRecords(produced).next_batch()  # kafka-python leaves a batch uncompressed where that is smaller
    assert batch is not None and client is not None and batch.validate_crc()
    assert batch.compression_type == client.compression_type
    assert (batch.producer_id, batch.producer_epoch) == ((900 + lane, 0) if idempotent else (-1, -1))
    assert batch.base_sequence == (17 if idempotent else -1)
    got = list(batch)
    assert len(got) == len(records)
    for record, (key, value, headers) in zip(got, records, strict=True):
        assert (record.key, record.value) == (key, value)
        # the proxy's tag first; a tag the client sent (copied from a consumed record, say) is not kept
        theirs = [h for h in headers if h[0] != TAG.decode()]
        assert list(record.headers) == [(TAG.decode(), str(lane).encode()), *theirs]


P, V = 4, 12  # physical partition 0 carries lanes 0, 4 and 8


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 4, 8, None, 5, 99]), st.integers(1, 4), st.sampled_from([0, 1, 3])),
                min_size=1, max_size=12),
       st.data())
def test_a_virtual_partitions_fetch_gets_its_records_only_and_reaches_the_end(
        log_spec: list[tuple[int | None, int, int]], data: st.DataObject) -> None:
    """Physical partition 0 holding its lanes 0, 4, 8 interleaved, with batches written around the proxy
    (untagged: None) or tagged for a lane it does not carry (5, 99); both count as its first lane, 0. A client of
    one lane fetches from any offset."""
    log, offsets, owner = bytearray(), 0, {}
    ends = []
    for i, (lane, count, codec) in enumerate(log_spec):
        values = [(None, f"{i}:{j}".encode(), []) for j in range(count)]
        batch = bytearray(client_batch(values, codec) if lane is None else tag(client_batch(values, codec), lane))
        set_base_offset(batch, 0, offsets)
        for j in range(count):
            owner[offsets + j] = (lane if lane in (0, 4, 8) else 0, f"{i}:{j}".encode())
        offsets += count
        log += batch
        ends.append((len(log), offsets))
    end = offsets
    lane = data.draw(st.sampled_from([0, 4, 8]))
    start = data.draw(st.integers(0, end))
    # the upstream answers from the batch holding `start` on, possibly cut inside a batch by its byte limit
    first = next((pos for pos, (_, last) in zip([0] + [e for e, _ in ends], ends, strict=False) if last > start),
                 len(log))
    cut = data.draw(st.integers(first, len(log)))
    answer = bytes(log[first:cut])
    complete_end = max([o for e, o in ends if e <= cut and o > start] or [start])
    filtered = keep_lane(answer, "t", lane, (P, V), start, Lanes())
    position, seen = start, []
    batches = MemoryRecords(filtered.records)
    while (batch := batches.next_batch()) is not None:
        assert batch.validate_crc()
        assert batch.next_offset > position or not seen, "no batch may end before the client's position"
        if not batch.is_control_batch:
            seen += [(r.offset, r.value) for r in batch if r.offset >= position]
        position = max(position, batch.next_offset)
    expected = [(o, v) for o, (lane_of, v) in sorted(owner.items()) if lane_of == lane and start <= o < complete_end]
    assert seen == expected
    assert position == complete_end, "the client moves past everything fetched, its own or not"


def test_the_skip_batch_is_a_commit_marker_every_client_steps_over() -> None:
    batch = MemoryRecords(skip_batch(10, 14)).next_batch()
    assert batch is not None and batch.validate_crc() and batch.is_control_batch
    assert (batch.base_offset, batch.next_offset) == (10, 15)
    (marker,) = list(batch)
    assert marker.offset == 14 and struct.unpack(">hh", marker.key) == (0, 1)  # version 0, COMMIT


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_tag_refuses_bytes_that_are_no_batch_with_a_clear_error(garbage: bytes) -> None:
    try:
        tag(garbage, 1)
    except (InvalidBatchError, TagError) as e:
        assert str(e)


def test_a_batch_that_does_not_decompress_is_refused_on_produce_and_passed_on_as_untagged() -> None:
    good = bytearray(client_batch([(b"k", b"v" * 100, [])], codec=1))
    assert good[22] & 0x07 == 1, "gzip"  # the low byte of the big-endian attributes
    good[61:] = b"\x1f\x8b" + bytes(len(good) - 63)  # a gzip header, then nothing gzip can read
    struct.pack_into(">I", good, 17, crc32c(bytes(good[21:])))  # and a CRC that says it is fine
    with pytest.raises(TagError):
        tag(bytes(good), 4)
    set_base_offset(good, 0, 0)
    kept = keep_lane(bytes(good), "t", 0, (P, V), 0, Lanes())
    assert kept.kept == 1 and keep_lane(bytes(good), "t", 4, (P, V), 0, Lanes()).kept == 0


def test_tag_refuses_records_that_do_not_fill_their_batch() -> None:
    good = bytearray(client_batch([(b"k", b"v", [])]))
    bad = bytes(good[:-1])  # one byte short: the batch length no longer matches
    with pytest.raises(InvalidBatchError):
        tag(bad, 1)


@given(st.lists(st.tuples(st.integers(0, 50), st.sampled_from(["a", "b"]), st.integers(0, 3)), max_size=30))
def test_rounds_name_each_physical_partition_once_and_keep_every_entry(entries: list[tuple[int, str, int]]) -> None:
    out = list(rounds(entries))
    assert sorted(e for r in out for e in r) == sorted(entries)
    for r in out:
        assert len({(t, p) for _, t, p in r}) == len(r)


def test_the_companion_topic_names_its_virtual_topic() -> None:
    assert offsets_topic_of(offsets_topic("orders")) == "orders"
    assert offsets_topic_of("orders") is None


async def test_an_upstream_producer_id_per_client_producer_and_virtual_partition() -> None:
    taken: list[int] = []
    failures = [1]

    async def take() -> tuple[int, int]:
        await asyncio.sleep(0)
        if failures[0]:
            failures[0] -= 1
            raise ConnectionError("upstream gone")
        taken.append(len(taken) + 100)
        return taken[-1], 0

    ids = ProducerIds(take, size=3)
    with pytest.raises(ConnectionError):
        await ids.upstream(7, 0, "t", 1)
    both = await asyncio.gather(ids.upstream(7, 0, "t", 1), ids.upstream(7, 0, "t", 1))
    assert both[0] == both[1] == (100, 0)  # asked once, though asked twice at once; the failure was not kept
    assert await ids.upstream(7, 0, "t", 11) == (101, 0)  # another virtual partition: its own id
    assert await ids.upstream(7, 1, "t", 1) == (102, 0)  # a new epoch of the client: a new id
    assert await ids.upstream(7, 0, "t", 11) == (101, 0)
    await ids.upstream(8, 0, "t", 1)  # a fourth pair: the least recently used, (7, 0, t, 1), is forgotten
    assert await ids.upstream(7, 0, "t", 1) == (104, 0)


def test_old_format_messages_belong_to_the_physical_partitions_first_lane_and_are_stepped_over() -> None:
    from kafka.record.legacy_records import LegacyRecordBatchBuilder

    old = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    old.append(0, timestamp=1, key=None, value=b"from long ago")
    legacy = bytearray(old.build())
    newer = bytearray(tag(client_batch([(None, b"lane 4", [])]), 4))
    set_base_offset(newer, 0, 1)
    records = bytes(legacy + newer)
    for lane, values in [(0, [b"from long ago"]), (4, [b"lane 4"]), (8, [])]:
        kept = keep_lane(records, "t", lane, (P, V), 0, Lanes())
        batches, got, position = MemoryRecords(kept.records), [], 0
        while (batch := batches.next_batch()) is not None:
            records_in = list(batch)
            if not getattr(batch, "is_control_batch", False):
                got += [r.value for r in records_in]
            # a legacy message ends at its offset; a v2 batch at its next offset
            position = max(position, getattr(batch, "next_offset", None) or records_in[-1].offset + 1)
        assert got == values and position == 2, lane
