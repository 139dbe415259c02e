"""The compactor (kafscale/storage/compaction.py) on the embedded store, with a clock the test moves."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kafscale.storage.compaction import Compactor
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.metadata_store import CompactedError


def test_history_is_kept_for_history_s_and_then_compacted(tmp_path: Path) -> None:
    async def run() -> None:
        store = EmbeddedStore(tmp_path / "meta.db")
        now = [0.0]
        compactor = Compactor(store, interval_s=300, history_s=600, clock=lambda: now[0])
        try:
            revisions = []
            for minute in range(0, 21, 5):  # a round every 5 minutes, writes in between
                now[0] = minute * 60.0
                state = await compactor.round()
                revisions.append(state.status.revision)
                for i in range(10):
                    await store.put(f"k/{i}", minute)
            # Rounds at 0..20 min: the first compaction at 10 min, to the revision seen at 0 min; at 20 min,
            # to the one seen at 10 min.
            assert compactor.compacted_revision == revisions[2]
            assert state.history_revisions == revisions[-1] - revisions[2]
            with pytest.raises(CompactedError):
                async for _ in store.watch("k/", start_revision=revisions[2] - 1):
                    break
            async for event in store.watch("k/", start_revision=revisions[2]):  # kept history resumes
                assert event.mod_revision == revisions[2]
                break
            assert state.status.db_bytes > 0
        finally:
            await store.close()

    asyncio.run(run())


def test_a_round_without_an_old_enough_revision_compacts_nothing(tmp_path: Path) -> None:
    async def run() -> None:
        store = EmbeddedStore(tmp_path / "meta.db")
        now = [0.0]
        compactor = Compactor(store, interval_s=1, history_s=600, clock=lambda: now[0])
        try:
            for second in range(0, 599, 60):
                now[0] = float(second)
                await store.put("k", second)
                assert (await compactor.round()).compacted_revision == 0
        finally:
            await store.close()

    asyncio.run(run())
