"""When a pack is garbage for good (kafscale.broker.pack_reaping), judged from the metadata store: the janitor's rule
(every lane's record gone and its end past the segment, or its writer fenced) and retention's stricter one (every
lane's segment also below the lane's log start: a segment a compaction replaced may still be read by a fetch that
looked it up before the swap)."""

from __future__ import annotations

from pathlib import Path

from kafscale.broker.pack_reaping import pack_is_dead
from kafscale.cluster import keys
from kafscale.storage import keys as object_keys
from kafscale.storage.async_store import AsyncObjectStore
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.local_store import LocalDirStore
from kafscale.storage.metadata_store import Put
from kafscale.storage.pack import build_pack
from kafscale.storage.segment import build_segment
from tests.unit.fake_broker import record_batch

TOPIC = "t"


async def test_retention_frees_only_a_pack_whose_every_segment_it_dropped(store: EmbeddedStore,
                                                                           tmp_path: Path) -> None:
    objects = AsyncObjectStore(LocalDirStore(tmp_path / "objects"))
    name = object_keys.pack_name(None, "a" * 32)
    key = object_keys.pack_key("ns", TOPIC, name)
    segment = build_segment([record_batch(b"v")], created_ms=1)
    data = build_pack([(0, 1, segment), (1, 1, segment)], 0, 2).data
    await objects.put(key, data)

    async def lanes(log_starts: tuple[int, int], replaced: bool) -> None:
        ops = [Put(keys.owner(TOPIC, p), {"shard": 0, "epoch": 1}) for p in (0, 1)]
        ops += [Put(keys.state(TOPIC, p), {"next_offset": 10, "log_start_offset": start, "epoch": 1})
                for p, start in enumerate(log_starts)]
        if replaced:  # partition 1's segment at 0 is now a compaction's, an object of its own
            ops.append(Put(keys.segment(TOPIC, 1, 0), {"base": 0, "last": 0, "cleaned": 7, "key_epoch": 1}))
        await store.txn([], ops)

    async def dead(dropped_only: bool) -> bool:
        return await pack_is_dead(store, objects, TOPIC, key, len(data), name, dropped_only=dropped_only)

    await lanes((1, 0), replaced=True)  # partition 0 dropped its segment, partition 1's was replaced
    assert await dead(dropped_only=False), "no record names it and none ever will: the janitor's, after its grace"
    assert not await dead(dropped_only=True), "a fetch may still read partition 1's replaced segment"
    await lanes((1, 1), replaced=True)  # retention dropped partition 1's too
    assert await dead(dropped_only=True)
    await store.txn([], [Put(keys.segment(TOPIC, 1, 0), {"base": 0, "last": 0, "pack": name, "position": 0})])
    assert not await dead(dropped_only=False), "a record names it"
    objects.close()
