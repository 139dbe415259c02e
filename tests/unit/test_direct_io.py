"""LocalDirStore writes large objects with O_DIRECT (kafscale/storage/direct_io.py): byte-exact, past the
page cache, and buffered again on a filesystem that refuses O_DIRECT."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import mmap
import os
import random
from pathlib import Path
from typing import Any

import pytest

from kafscale.storage import direct_io
from kafscale.storage.direct_io import ALIGN, MIN_BYTES, O_DIRECT, PIECE_BYTES
from kafscale.storage.local_store import TEMP_PREFIX, LocalDirStore


@pytest.fixture(autouse=True)
def _needs_o_direct(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if O_DIRECT == 0:
        pytest.skip("the platform has no O_DIRECT")
    try:
        fd = os.open(tmp_path / "probe", os.O_WRONLY | os.O_CREAT | O_DIRECT, 0o644)
        try:
            os.write(fd, mmap.mmap(-1, ALIGN))
        finally:
            os.close(fd)
    except OSError as e:
        pytest.skip(f"the filesystem under {tmp_path} refuses O_DIRECT ({e})")
    cached = cached_pages(tmp_path / "probe")[0]
    os.unlink(tmp_path / "probe")
    if cached and request.node.get_closest_marker("page_cache"):
        pytest.skip(f"the filesystem under {tmp_path} caches O_DIRECT writes all the same (tmpfs does)")

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def cached_pages(path: Path) -> tuple[int, int]:
    """(pages of the file in the page cache, pages of the file), from mincore(2)."""
    size = path.stat().st_size
    pages = -(-size // mmap.PAGESIZE)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mapping:
        address = ctypes.addressof(ctypes.c_char.from_buffer(mapping))  # maps, touches no page
        vec = (ctypes.c_ubyte * pages)()
        if _libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        resident = sum(v & 1 for v in vec)
        del address
    return resident, pages


SIZES = [MIN_BYTES, MIN_BYTES + 1, PIECE_BYTES, 3 * PIECE_BYTES + 77, 4 * PIECE_BYTES - ALIGN + 1]


@pytest.mark.page_cache
@pytest.mark.parametrize("size", SIZES)
def test_large_objects_are_stored_byte_exact_and_skip_the_page_cache(tmp_path: Path, size: int) -> None:
    store = LocalDirStore(tmp_path)
    data = random.Random(size).randbytes(size)
    assert store.put_if_absent("t/0/seg.kfs", data)
    store.put("t/0/other.kfs", data[::-1])
    for key, expected in (("t/0/seg.kfs", data), ("t/0/other.kfs", data[::-1])):
        path = tmp_path / key
        assert path.stat().st_size == size
        resident, pages = cached_pages(path)
        assert resident == 0, f"{resident} of {pages} pages went through the page cache"
        assert store.get(key) == expected
    assert store._files.direct.enabled
    assert [p for p in tmp_path.rglob("*") if p.name.startswith(TEMP_PREFIX)] == []


def test_small_objects_stay_buffered(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    data = b"i" * (MIN_BYTES - 1)
    store.put("t/0/seg.index", data)
    resident, pages = cached_pages(tmp_path / "t/0/seg.index")
    assert resident == pages
    assert store.get("t/0/seg.index") == data


def _refuse_o_direct(monkeypatch: pytest.MonkeyPatch, where: str) -> list[int]:
    """A filesystem without O_DIRECT (a fault no filesystem on this machine produces): EINVAL on open or
    on the first write, as tmpfs before Linux 6.6 and many FUSE filesystems answer."""
    refusals: list[int] = []
    real_open, real_write = os.open, direct_io.os.write

    def fake_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if where == "open" and flags & O_DIRECT:
            refusals.append(flags)
            raise OSError(errno.EINVAL, "Invalid argument", str(path))
        return real_open(path, flags, *args, **kwargs)

    def fake_write(fd: int, data: Any) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & O_DIRECT:
            refusals.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr("kafscale.storage.local_store.os.open", fake_open)
    if where == "write":
        monkeypatch.setattr(direct_io.os, "write", fake_write)
    return refusals


@pytest.mark.parametrize("where", ["open", "write"])
def test_a_filesystem_without_o_direct_gets_buffered_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    store = LocalDirStore(tmp_path)
    refusals = _refuse_o_direct(monkeypatch, where)
    data = random.Random(1).randbytes(2 * PIECE_BYTES + 5)
    assert store.put_if_absent("t/0/a.kfs", data)
    assert store.put_if_absent("t/0/b.kfs", data)
    monkeypatch.undo()
    assert len(refusals) == 1, "refused once, then buffered for good"
    assert not store._files.direct.enabled
    assert store.get("t/0/a.kfs") == data and store.get("t/0/b.kfs") == data
    assert [p for p in tmp_path.rglob("*") if p.name.startswith(TEMP_PREFIX)] == []
