"""What is specific to LocalDirStore, the object store on a local directory (split whole from
tests/integration/test_object_store.py, whose conformance suite runs every backend, this one included)."""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
import os
import random
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from kafscale.storage.local_store import TEMP_PREFIX, LocalDirStore
from kafscale.storage.object_store import ObjectInfo, ObjectNotFoundError, ObjectStoreError


def payload(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def keys_of(infos: Iterable[ObjectInfo]) -> list[str]:
    return [info.key for info in infos]


# -- LocalDirStore --------------------------------------------------------------------------------

ESCAPING_KEYS = ["../x", "a/../../x", "a/..", "/etc/passwd", "..", ".", "a/./b", "a//b", "", "a/", "x\0y"]


@pytest.mark.parametrize("key", ESCAPING_KEYS)
def test_local_rejects_keys_outside_root(tmp_path: Path, key: str) -> None:
    store = LocalDirStore(tmp_path / "root")
    operations: list[Callable[[], object]] = [
        lambda: store.put(key, b"x"),
        lambda: store.put_if_absent(key, b"x"),
        lambda: store.get(key),
        lambda: store.get_range(key, 0, 1),
        lambda: store.head(key),
        lambda: store.delete(key),
    ]
    for operation in operations:
        with pytest.raises(ValueError, match="invalid object key") as info:
            operation()
        assert repr(key) in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root"]
    assert list((tmp_path / "root").iterdir()) == []


def test_local_reserves_temp_names(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    with pytest.raises(ValueError, match="reserved"):
        store.put(f"a/{TEMP_PREFIX}1", b"x")


def test_local_layout_and_no_temp_files_left(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    store.put("t/0/seg.kfs", b"abc")
    assert (tmp_path / "t" / "0" / "seg.kfs").read_bytes() == b"abc"
    for i in range(20):
        store.put(f"t/0/{i}", b"x" * i)
        store.put(f"t/0/{i}", b"y" * i)
        store.put_if_absent(f"t/1/{i}", b"z")
        store.put_if_absent(f"t/1/{i}", b"lost")
    leftovers = [p for p in tmp_path.rglob("*") if p.name.startswith(TEMP_PREFIX)]
    assert leftovers == []


@pytest.mark.parametrize("unnamed", [True, False], ids=["unnamed-files", "temporary-names"])
def test_local_put_all_if_absent_both_ways(tmp_path: Path, unnamed: bool) -> None:
    # Conditional creates start as unnamed files (O_TMPFILE) linked into place; where the filesystem or
    # /proc cannot do that, under a temporary name. Either way the same objects, and nothing else, result.
    store = LocalDirStore(tmp_path)
    assert store._unnamed
    store._unnamed = unnamed
    segment, index = payload(600 * 1024, 1), payload(1500, 2)  # the segment goes through O_DIRECT
    assert store.put_all_if_absent([("t/0/s.kfs", segment), ("t/0/s.index", index)]) == [True, True]
    assert store.put_all_if_absent([("t/0/s.kfs", b"x"), ("t/0/s2.index", b"y")]) == [False, True]
    assert store.get("t/0/s.kfs") == segment and store.get("t/0/s.index") == index
    assert sorted(p.name for p in (tmp_path / "t" / "0").iterdir()) == ["s.index", "s.kfs", "s2.index"]
    umask = os.umask(0o022)
    os.umask(umask)
    assert (tmp_path / "t" / "0" / "s.kfs").stat().st_mode & 0o777 == 0o644 & ~umask


def test_local_listing_skips_temp_files(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    store.put("t/a", b"1")
    (tmp_path / "t" / f"{TEMP_PREFIX}crashed-writer").write_bytes(b"partial")
    assert keys_of(store.list("")) == ["t/a"]


def test_local_delete_prunes_empty_directories_but_not_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = LocalDirStore(root)
    store.put("a/b/c/1", b"1")
    store.put("a/x", b"2")
    store.delete("a/b/c/1")
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == ["a", "a/x"]
    store.delete("a/x")
    assert root.is_dir() and list(root.iterdir()) == []


def test_local_key_that_is_a_directory(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    store.put("a/b/c", b"1")
    assert store.head("a/b") is None
    with pytest.raises(ObjectNotFoundError):
        store.get("a/b")
    store.delete("a/b")  # not an object: nothing to do
    with pytest.raises(ObjectStoreError, match="a/b"):
        store.put("a/b", b"x")
    with pytest.raises(ObjectStoreError, match="a/b/c/d"):
        store.put("a/b/c/d", b"x")  # "a/b/c" is an object, so it cannot be a directory too
    assert store.get("a/b/c") == b"1"


@pytest.mark.parametrize("unnamed", [True, False], ids=["unnamed-files", "temporary-names"])
def test_local_writes_race_deletes_pruning_directories(tmp_path: Path, unnamed: bool) -> None:
    # Deletes remove emptied directories while other threads create files in them. Unnamed files do not
    # keep a directory from looking empty, so there the prune can come between the file and its link.
    store = LocalDirStore(tmp_path)
    assert store._unnamed  # this machine's filesystem has O_TMPFILE
    store._unnamed = unnamed
    errors: list[BaseException] = []

    def churn(worker: int) -> None:
        try:
            # Nested, so that a delete prunes two levels while a put recreates them.
            for i in range(250):
                key = f"churn/{i % 3}/x/{worker}"
                if i % 2:
                    store.put(key, b"x")
                else:
                    store.put_if_absent(key, b"y")
                store.delete(key)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=churn, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert list(store.list("")) == []


RACE_ROUNDS = 3


def _race_in_process(
    root: str, index: int, barrier: multiprocessing.synchronize.Barrier, results: multiprocessing.Queue
) -> None:
    store = LocalDirStore(root)
    data = payload(256 * 1024, seed=index)
    for round_ in range(RACE_ROUNDS):
        barrier.wait()
        results.put((round_, index, store.put_if_absent(f"race/{round_}.kfs", data)))


def test_local_put_if_absent_across_processes(tmp_path: Path) -> None:
    # spawn, not fork: forking a process that runs threads (moto, thread pools) can deadlock.
    ctx = multiprocessing.get_context("spawn")
    processes = 6
    barrier = ctx.Barrier(processes)
    results = ctx.Queue()
    workers = [
        ctx.Process(target=_race_in_process, args=(str(tmp_path), i, barrier, results)) for i in range(processes)
    ]
    for w in workers:
        w.start()
    try:
        outcomes = [results.get(timeout=60) for _ in range(processes * RACE_ROUNDS)]
    finally:
        for w in workers:
            w.join(timeout=30)
            if w.is_alive():
                w.kill()
    assert [w.exitcode for w in workers] == [0] * processes
    store = LocalDirStore(tmp_path)
    for round_ in range(RACE_ROUNDS):
        winners = [index for r, index, won in outcomes if r == round_ and won]
        assert len(winners) == 1, outcomes
        assert store.get(f"race/{round_}.kfs") == payload(256 * 1024, seed=winners[0])
    assert [p for p in tmp_path.rglob("*") if p.name.startswith(TEMP_PREFIX)] == []
