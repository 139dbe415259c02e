"""Pack objects (kafscale.storage.pack): each lane's segment and index readable as a byte range; a damaged or
cut trailer is refused naming the object."""

from __future__ import annotations

import pytest

from kafscale.storage.batch import CorruptSegmentError, set_base_offset
from kafscale.storage.index import SegmentIndex
from kafscale.storage.pack import TAIL_READ, build_pack, parse_trailer
from kafscale.storage.segment import BuiltSegment, SegmentReader, build_segment
from tests.unit.fake_broker import record_batch


def _segment(base: int, *values: bytes) -> BuiltSegment:
    batch = record_batch(*values)
    set_base_offset(batch, 0, base)
    return build_segment([batch], created_ms=1, index_interval_bytes=1)


def test_each_lane_reads_back_as_the_segment_and_index_it_was() -> None:
    lanes = [(0, _segment(0, b"a", b"b")), (10, _segment(7, b"c")), (20, _segment(3, b"d", b"e", b"f"))]
    pack = build_pack(lanes)
    found = parse_trailer(pack.data[-TAIL_READ:], len(pack.data), key="k")
    assert found == pack.lanes and [p.lane for p in found] == [0, 10, 20]
    for p, (_, built) in zip(found, lanes, strict=True):
        assert pack.data[p.position:p.position + p.size] == built.data
        assert pack.data[p.index_position:p.index_position + p.index_size] == built.index
        reader = SegmentReader(pack.data[p.position:p.position + p.size], key="k")  # every check of a segment
        assert reader.info == built.info
        SegmentIndex.parse(pack.data[p.index_position:p.index_position + p.index_size], key="k")


def test_a_pack_needs_lanes_each_once() -> None:
    with pytest.raises(ValueError, match="at least one lane"):
        build_pack([])
    with pytest.raises(ValueError, match="packed twice"):
        build_pack([(1, _segment(0, b"a")), (1, _segment(1, b"b"))])


def test_every_damaged_or_cut_trailer_byte_is_refused_naming_the_object() -> None:
    pack = build_pack([(0, _segment(0, b"a")), (5, _segment(0, b"b"))]).data
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
    with pytest.raises(CorruptSegmentError, match="does not fit"):
        parse_trailer(pack[-24:], len(pack), key="k")  # a tail read too short for the whole trailer
