"""Fixtures the unit tests share: one partition's real stores (the partition-owner tests) and an embedded metadata
store (the coordinators' and the batchers' tests)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.local_store import LocalDirStore
from tests.unit.test_partition_owner import Env


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    """One partition's real stores (the embedded metadata store, a local object directory)."""
    meta = EmbeddedStore(tmp_path / "meta.sqlite", fsync=False)
    e = Env(meta, LocalDirStore(tmp_path / "objects"))
    try:
        yield e
    finally:
        await e.aclose()
        await meta.close()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmbeddedStore]:
    """A real embedded metadata store, without fsync (no test here kills the process)."""
    meta = EmbeddedStore(tmp_path / "meta.sqlite", fsync=False)
    try:
        yield meta
    finally:
        await meta.close()
