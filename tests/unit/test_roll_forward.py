"""Rolling a partition forward from the object store after a metadata restore (kafscale/broker/snapshot.py):
which objects become the committed log when leftovers, retention and stray objects are in the way."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from kafscale.broker.packed import packed_segments
from kafscale.broker.snapshot import _longest_chain, _roll_forward
from kafscale.cluster import keys
from kafscale.storage import keys as object_keys
from kafscale.storage.async_store import AsyncObjectStore
from kafscale.storage.batch import set_base_offset
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.local_store import LocalDirStore
from kafscale.storage.pack import build_pack
from kafscale.storage.segment import build_segment
from tests.unit.fake_broker import record_batch

NS, TOPIC = "default", "t"


def put_segment(objects: LocalDirStore, base: int, count: int, epoch: int = 0, index: bool = True) -> None:
    batch = record_batch(*[f"r{base + i}".encode() for i in range(count)])
    set_base_offset(batch, 0, base)
    built = build_segment([batch], created_ms=1)
    objects.put(object_keys.segment_key(NS, TOPIC, 0, base, epoch), built.data)
    if index:
        objects.put(object_keys.index_key(NS, TOPIC, 0, base, epoch), built.index)


def roll(tmp_path: Path, state: dict[str, Any] | None, known: dict[str, Any] | None = None) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        meta = EmbeddedStore(tmp_path / "meta.db")
        objects = AsyncObjectStore(LocalDirStore(tmp_path / "objects"))
        try:
            for k, v in (known or {}).items():
                await meta.put(k, v)
            await _roll_forward(meta, objects, NS, TOPIC, 0, state, None, known)
            segments = [kv.value for kv in await meta.range(keys.segments(TOPIC, 0))]
            return {"state": (await meta.get(keys.state(TOPIC, 0))).value,  # type: ignore[union-attr]
                    "segments": [(s["base"], s["last"], s["key_epoch"]) for s in segments]}
        finally:
            await meta.close()
            objects.close()

    return asyncio.run(run())


def test_a_fenced_owners_leftover_loses_to_the_committed_run_that_goes_on(tmp_path: Path) -> None:
    objects = LocalDirStore(tmp_path / "objects")
    put_segment(objects, 0, 10)
    put_segment(objects, 10, 10)  # committed by the new owner: 10..19, then 20..29
    put_segment(objects, 20, 10)
    put_segment(objects, 10, 5, epoch=1)  # the old owner's retry after it was fenced: 10..14, never committed
    got = roll(tmp_path, {"next_offset": 10, "log_start_offset": 0, "epoch": 2})
    assert got["segments"] == [(10, 19, 0), (20, 29, 0)]
    assert got["state"]["next_offset"] == 30 and got["state"]["epoch"] == 2


def test_segments_retention_removed_after_the_snapshot_leave_the_log(tmp_path: Path) -> None:
    objects = LocalDirStore(tmp_path / "objects")
    put_segment(objects, 20, 10)  # 0..19 were deleted by retention after the snapshot
    put_segment(objects, 30, 5)
    known = {keys.segment(TOPIC, 0, b): {"base": b, "last": b + 9, "size": 1, "records": 10, "min_ts": 1,
                                         "max_ts": 1, "crc": 0, "created_ms": 1, "key_epoch": 0} for b in (0, 10, 20)}
    got = roll(tmp_path, {"next_offset": 30, "log_start_offset": 0, "epoch": 1}, known)
    assert got["segments"] == [(20, 29, 0), (30, 34, 0)]
    assert got["state"]["log_start_offset"] == 20 and got["state"]["next_offset"] == 35


def test_a_rebuild_starts_where_the_longest_run_does_past_stray_objects(tmp_path: Path) -> None:
    objects = LocalDirStore(tmp_path / "objects")
    put_segment(objects, 0, 3, index=False)  # half an upload: no index
    put_segment(objects, 2, 2, epoch=4)  # a stray leftover, a dead end at 4
    for base in (5, 10, 15):
        put_segment(objects, base, 5)
    got = roll(tmp_path, None)
    assert got["segments"] == [(5, 9, 0), (10, 14, 0), (15, 19, 0)]
    assert got["state"] == {"next_offset": 20, "log_start_offset": 5, "epoch": 4}


def test_equal_runs_go_to_the_highest_epoch_then_the_latest_cleaning() -> None:
    assert _longest_chain({(0, (0, 0, "")): 9, (0, (3, 0, "")): 9}, 0) == [(0, (3, 0, ""))]
    assert _longest_chain({}, 7) == []
    # A cleaning's segment spans the two it replaced: it wins over them while the janitor has not deleted them.
    flushed = {(0, (1, 0, "")): 4, (5, (1, 0, "")): 9, (10, (2, 0, "")): 12}
    assert _longest_chain(flushed | {(0, (1, 1, "")): 9}, 0) == [(0, (1, 1, "")), (10, (2, 0, ""))]
    assert _longest_chain(flushed | {(0, (1, 1, "")): 9, (0, (1, 2, "")): 12}, 0) == [(0, (1, 2, ""))]


def test_of_two_packed_segments_reaching_as_far_the_later_owners_wins(tmp_path: Path) -> None:
    """A fenced owner's upload and its successor's, the same records resent at the same offset: a virtual
    partition's packs record each writer's epoch, so the successor's (committed) one is rolled forward."""
    async def run() -> tuple[list[Any], dict[str, Any]]:
        objects = AsyncObjectStore(LocalDirStore(tmp_path / "objects"))
        meta = EmbeddedStore(tmp_path / "meta.db")
        try:
            names = {}
            for epoch, value in ((3, b"fenced"), (4, b"committed")):
                batch = record_batch(value)
                set_base_offset(batch, 0, 0)
                # the fenced writer's pack has the name that sorts last: only its epoch can lose it the tie
                name = object_keys.pack_name(0, ("f" if epoch == 3 else "0") * 32)
                names[epoch] = name
                pack = build_pack([(0, epoch, build_segment([batch], created_ms=1))], 1, 2)
                await objects.put(object_keys.pack_key(NS, TOPIC, name), pack.data)
            listed = await objects.list(f"{NS}/{TOPIC}/")
            packed = await packed_segments(objects, NS, TOPIC, listed)
            await _roll_forward(meta, objects, NS, TOPIC, 0, None, None, None, packed[0])
            segments = [kv.value for kv in await meta.range(keys.segments(TOPIC, 0))]
            owner = (await meta.get(keys.owner(TOPIC, 0))).value  # type: ignore[union-attr]
            return [(s["base"], s["pack"]) for s in segments], {"owner": owner, "names": names}
        finally:
            await meta.close()
            objects.close()

    segments, seen = asyncio.run(run())
    assert segments == [(0, seen["names"][4])]
    assert seen["owner"]["epoch"] == 4, "the next owner's epoch goes past every writer's"
