"""The packer (kafscale.broker.packer): lanes sealing within a window share one PUT; a lane's next segment goes into
the next pack; a failed PUT fails every lane's upload, and each one's retry joins a later pack."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from kafscale.broker.packer import Packer
from kafscale.storage import keys as object_keys
from kafscale.storage.async_store import AsyncObjectStore
from kafscale.storage.batch import CorruptSegmentError, set_base_offset
from kafscale.storage.local_store import LocalDirStore
from kafscale.storage.object_store import ObjectStoreError
from kafscale.storage.pack import build_pack, parse_trailer
from kafscale.storage.segment import BuiltSegment, SegmentReader, build_segment
from tests.unit.fake_broker import record_batch


def _segment(base: int, value: bytes) -> BuiltSegment:
    batch = record_batch(value)
    set_base_offset(batch, 0, base)
    return build_segment([batch], created_ms=1)


class FailingOnce(LocalDirStore):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.failures = 1

    def put_if_absent(self, key: str, data: bytes) -> bool:
        if self.failures:
            self.failures -= 1
            raise ObjectStoreError("503 SlowDown")
        return super().put_if_absent(key, data)


async def test_lanes_sealing_together_share_one_pack_and_each_reads_back_its_own(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    objects = AsyncObjectStore(store)
    announced: list[tuple[str, list[tuple[str, int]]]] = []
    packer = Packer(objects, "ns", "t", 1, [1, 4, 7], (3, 9), window_s=0.05,
                    announce=lambda pack, lanes: announced.append((pack, lanes)))
    built = {1: _segment(0, b"one"), 4: _segment(9, b"four"), 7: _segment(3, b"seven")}
    places = await asyncio.gather(*(packer.upload(lane, 2, b) for lane, b in built.items()))
    assert packer.packs == 1 and len({p.pack for p in places}) == 1
    assert announced == [(places[0].pack, [("t", 1), ("t", 4), ("t", 7)])]  # the lanes, to the shard's batcher
    key = object_keys.pack_key("ns", "t", places[0].pack)
    assert key.startswith("ns/t/1/pack-") and key.endswith(".kfp")
    data = store.get(key)
    trailer = parse_trailer(data, len(data))
    assert {(p.lane, p.epoch) for p in trailer.lanes} == {(1, 2), (4, 2), (7, 2)}
    assert (trailer.physical, trailer.virtual) == (3, 9)
    for (_lane, b), place in zip(built.items(), places, strict=True):
        assert SegmentReader(data[place.position:place.position + len(b.data)]).info == b.info
        assert data[place.position + len(b.data):place.position + len(b.data) + place.index_size] == b.index
    objects.close()


async def test_a_lanes_next_segment_goes_into_the_next_pack(tmp_path: Path) -> None:
    objects = AsyncObjectStore(LocalDirStore(tmp_path))
    packer = Packer(objects, "ns", "t", 0, [0, 2], (3, 9), window_s=0.02)
    first, second, other = await asyncio.gather(packer.upload(0, 1, _segment(0, b"a")),
                                                packer.upload(0, 1, _segment(1, b"b")),
                                                packer.upload(2, 1, _segment(0, b"c")))
    assert first.pack == other.pack != second.pack and packer.packs == 2
    objects.close()


async def test_a_failed_put_fails_every_lane_and_a_retry_joins_a_later_pack(tmp_path: Path) -> None:
    objects = AsyncObjectStore(FailingOnce(tmp_path))
    packer = Packer(objects, "ns", "t", 0, [0, 2], (3, 9), window_s=0.01)
    results = await asyncio.gather(packer.upload(0, 1, _segment(0, b"a")), packer.upload(2, 1, _segment(0, b"c")),
                                   return_exceptions=True)
    assert all(isinstance(r, ObjectStoreError) for r in results) and packer.packs == 0
    again = await asyncio.gather(packer.upload(0, 1, _segment(0, b"a")), packer.upload(2, 1, _segment(0, b"c")))
    assert again[0].pack == again[1].pack and packer.packs == 1
    objects.close()


def test_a_pack_name_is_checked() -> None:
    with pytest.raises(ValueError, match="not a pack name"):
        object_keys.pack_key("ns", "t", "../other/pack-x.kfp")
    assert object_keys.pack_name_of("ns/t/3/pack-" + "a" * 32 + ".kfp", "ns", "t") == "3/pack-" + "a" * 32 + ".kfp"
    assert object_keys.pack_name_of("ns/t/3/segment-00000000000000000000.kfs", "ns", "t") is None
    assert object_keys.parse_segment_key("ns/t/3/pack-" + "a" * 32 + ".kfp") is None


async def test_a_lanes_next_segment_does_not_wait_for_the_previous_put(tmp_path: Path) -> None:
    class SlowPut(LocalDirStore):
        def put_if_absent(self, key: str, data: bytes) -> bool:
            time.sleep(0.3)
            return super().put_if_absent(key, data)

    objects = AsyncObjectStore(SlowPut(tmp_path))
    packer = Packer(objects, "ns", "t", 0, [0], (3, 9), window_s=0.01)
    started = time.monotonic()
    await asyncio.gather(packer.upload(0, 1, _segment(0, b"a")), packer.upload(0, 1, _segment(1, b"b")))
    assert packer.packs == 2 and time.monotonic() - started < 0.55, "the two PUTs overlapped"
    objects.close()


async def test_a_window_cancelled_before_its_put_fails_its_lanes_and_the_next_one_works(tmp_path: Path) -> None:
    objects = AsyncObjectStore(LocalDirStore(tmp_path))
    packer = Packer(objects, "ns", "t", 0, [0], (3, 9), window_s=5)
    upload = asyncio.ensure_future(packer.upload(0, 1, _segment(0, b"a")))
    await asyncio.sleep(0.01)
    for task in list(packer._storing):
        task.cancel()
    with pytest.raises(ObjectStoreError, match="cancelled"):
        await upload
    packer.window_s = 0.01
    assert (await packer.upload(0, 1, _segment(0, b"a"))).pack and packer.packs == 1
    objects.close()


async def test_a_plain_topics_pack_lies_in_its_packs_directory_and_says_it_is_plain(tmp_path: Path) -> None:
    """A plain topic's partitions on one shard share packs in the topic's `packs/`; the trailer's layout is (0,
    partitions), and a partition made after the packer (CreatePartitions) still fits the recorded count."""
    store = LocalDirStore(tmp_path)
    objects = AsyncObjectStore(store)
    packer = Packer(objects, "ns", "t", None, [0, 1, 2], (0, 3), window_s=0.01)
    places = await asyncio.gather(packer.upload(0, 1, _segment(0, b"a")), packer.upload(4, 2, _segment(7, b"e")))
    assert places[0].pack == places[1].pack and places[0].pack.startswith("packs/pack-")
    key = object_keys.pack_key("ns", "t", places[0].pack)
    assert key == object_keys.packs_prefix("ns", "t") + places[0].pack.split("/")[1]
    assert object_keys.pack_name_of(key, "ns", "t") == places[0].pack
    assert object_keys.pack_name_of(key, "ns", "packs") is None  # not a pack of a topic named "packs"
    data = store.get(key)
    trailer = parse_trailer(data, len(data))
    assert (trailer.physical, trailer.virtual) == (0, 5)
    assert [(p.lane, p.epoch, p.base) for p in trailer.lanes] == [(0, 1, 0), (4, 2, 7)]
    objects.close()


def test_a_trailer_layout_is_checked() -> None:
    segment = _segment(0, b"a")
    for physical, virtual in ((0, 1), (1, 1), (2, 4)):
        data = build_pack([(0, 1, segment)], physical, virtual).data
        assert (parse_trailer(data, len(data)).physical, parse_trailer(data, len(data)).virtual) == (physical, virtual)
    for physical, virtual, lane in ((-1, 4, 0), (0, 0, 0), (3, 4, 0), (0, 2, 2), (2, 4, 4)):
        data = build_pack([(lane, 1, segment)], physical, virtual).data
        with pytest.raises(CorruptSegmentError, match="layout"):
            parse_trailer(data, len(data))


async def test_a_plain_topics_pack_goes_as_soon_as_every_lane_that_sealed_has_arrived(tmp_path: Path) -> None:
    """Lanes that sealed together say so (`coming`): their pack goes when the last of them arrives, not at the end
    of its window; until then it waits."""
    objects = AsyncObjectStore(LocalDirStore(tmp_path))
    packer = Packer(objects, "ns", "t", None, [0, 1, 2], (0, 3), window_s=5.0)
    started = time.monotonic()
    for lane in (0, 1, 2):
        packer.coming(lane)
    first = asyncio.ensure_future(packer.upload(0, 1, _segment(0, b"a")))
    second = asyncio.ensure_future(packer.upload(1, 1, _segment(0, b"b")))
    await asyncio.sleep(0.2)
    assert not first.done() and not second.done(), "lane 2 is still coming"
    third = await packer.upload(2, 1, _segment(0, b"c"))
    assert (await first).pack == (await second).pack == third.pack and time.monotonic() - started < 1.0
    alone = await packer.upload(0, 1, _segment(1, b"d"))  # nothing else sealed: it goes at once
    assert alone.pack != third.pack and packer.packs == 2 and time.monotonic() - started < 1.0
    objects.close()
