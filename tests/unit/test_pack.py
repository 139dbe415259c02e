"""Pack objects (kafscale.storage.pack): each lane's segment and index readable as a byte range; a damaged or
cut trailer is refused naming the object."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from crc32c import crc32c

from kafscale.storage.batch import CorruptSegmentError, set_base_offset
from kafscale.storage.index import SegmentIndex
from kafscale.storage.pack import TAIL_READ, TrailerBeyondTail, build_pack, parse_trailer
from kafscale.storage.segment import BuiltSegment, SegmentReader, build_segment
from tests.unit.fake_broker import record_batch


def _segment(base: int, *values: bytes) -> BuiltSegment:
    batch = record_batch(*values)
    set_base_offset(batch, 0, base)
    return build_segment([batch], created_ms=1, index_interval_bytes=1)


def test_each_lane_reads_back_as_the_segment_and_index_it_was() -> None:
    lanes = [(0, 3, _segment(0, b"a", b"b")), (10, 4, _segment(7, b"c")), (20, 3, _segment(3, b"d", b"e", b"f"))]
    pack = build_pack(lanes, 10, 30)
    trailer = parse_trailer(pack.data[-TAIL_READ:], len(pack.data), key="k")
    found = trailer.lanes
    assert (trailer.physical, trailer.virtual) == (10, 30)
    assert found == pack.lanes and [(p.lane, p.epoch, p.base) for p in found] == [(0, 3, 0), (10, 4, 7), (20, 3, 3)]
    for p, (_, _, built) in zip(found, lanes, strict=True):
        assert pack.data[p.position:p.position + p.size] == built.data
        assert pack.data[p.index_position:p.index_position + p.index_size] == built.index
        reader = SegmentReader(pack.data[p.position:p.position + p.size], key="k")  # every check of a segment
        assert reader.info == built.info
        SegmentIndex.parse(pack.data[p.index_position:p.index_position + p.index_size], key="k")


def test_a_pack_needs_lanes_each_once() -> None:
    with pytest.raises(ValueError, match="at least one lane"):
        build_pack([], 1, 1)
    with pytest.raises(ValueError, match="packed twice"):
        build_pack([(1, 1, _segment(0, b"a")), (1, 1, _segment(1, b"b"))], 1, 2)


def test_every_damaged_or_cut_trailer_byte_is_refused_naming_the_object() -> None:
    pack = build_pack([(0, 1, _segment(0, b"a")), (5, 1, _segment(0, b"b"))], 5, 10).data
    trailer_size = int.from_bytes(pack[-8:-4], "big")
    for at in range(len(pack) - trailer_size, len(pack)):
        damaged = bytearray(pack)
        damaged[at] ^= 0x41
        with pytest.raises(CorruptSegmentError) as e:
            parse_trailer(bytes(damaged), len(damaged), key="ns/t/0/pack")
        assert e.value.key == "ns/t/0/pack", at
    for cut in range(1, trailer_size + 1):
        with pytest.raises(CorruptSegmentError):
            parse_trailer(pack[:-cut], len(pack) - cut, key="k")
    with pytest.raises(TrailerBeyondTail) as short:
        parse_trailer(pack[-30:], len(pack), key="k")  # a tail read too short for the whole trailer
    assert short.value.size == trailer_size
    assert parse_trailer(pack[-short.value.size:], len(pack)) == parse_trailer(pack, len(pack))


def test_a_trailer_whose_layout_cannot_hold_its_lanes_is_refused() -> None:
    with pytest.raises(CorruptSegmentError, match="layout"):
        data = build_pack([(7, 1, _segment(0, b"a"))], 5, 5).data  # lane 7 of a 5-partition topic
        parse_trailer(data, len(data))
    with pytest.raises(CorruptSegmentError, match="layout"):
        data = build_pack([(0, 1, _segment(0, b"a"))], 3, 10).data  # 10 is no multiple of 3
        parse_trailer(data, len(data))


def _with_lanes(pack: bytes, lanes: list[tuple[int, int, int, int, int, int]]) -> bytes:
    """The pack's lane bytes under a trailer listing `lanes`, its CRC right: what only the structure checks catch."""
    trailer_size = int.from_bytes(pack[-8:-4], "big")
    trailer = struct.pack(">4siii", b"PKT1", 5, 10, len(lanes)) + b"".join(struct.pack(">iqqqii", *lane)
                                                                        for lane in lanes)
    return pack[:-trailer_size] + trailer + struct.pack(">Ii4s", crc32c(trailer), len(trailer) + 12, b"PACK")


@pytest.mark.parametrize(("change", "message"), [
    (lambda ls: [ls[0], (ls[0][0], *ls[1][1:])], "not distinct lanes"),
    (lambda ls: [(-1, *ls[0][1:]), ls[1]], "not distinct lanes"),
    (lambda ls: [(ls[0][0], -1, *ls[0][2:]), ls[1]], "not distinct lanes"),
    (lambda ls: [(*ls[0][:2], -1, *ls[0][3:]), ls[1]], "not distinct lanes"),
    (lambda ls: [ls[0], (*ls[1][:3], ls[1][3] + 1, ls[1][4] - 1, ls[1][5])], "does not follow"),
    (lambda ls: [ls[0], (*ls[1][:5], ls[1][5] - 1)], "lanes end at"),
    (lambda ls: [ls[0]], "lanes end at"),
    (lambda ls: [(*ls[0][:3], 0, 40, ls[0][4] + ls[0][5] - 40), ls[1]], "does not follow"),
])
def test_a_trailer_whose_lanes_do_not_tile_the_object_is_refused(change: Any, message: str) -> None:
    built = build_pack([(0, 1, _segment(0, b"a")), (5, 1, _segment(0, b"b"))], 5, 10)
    lanes = [(p.lane, p.epoch, p.base, p.position, p.size, p.index_size) for p in built.lanes]
    with pytest.raises(CorruptSegmentError, match=message):
        damaged = _with_lanes(built.data, change(lanes))
        parse_trailer(damaged, len(damaged), key="k")
