"""A cleaning pass as a Ray task (kafscale.actors.cleaning_task), on the session's Ray: the task opens the
broker's object store from its settings, reads the segments, writes the cleaned one, and sends back only records
and figures."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from kafscale.actors.cleaning_task import ray_offload
from kafscale.cluster.records import SegmentMeta
from kafscale.compaction.cleaner import Job
from kafscale.config import BrokerConfig
from kafscale.storage.local_store import LocalDirStore
from kafscale.storage.segment import SegmentReader, build_segment
from tests.unit.test_cleaner import NOW, batch


def test_a_pass_runs_as_a_ray_task_against_the_brokers_store(ray_runtime: Any, tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path / "objects")
    segments = []
    for base, rows in ((0, [(b"a", b"a0"), (b"b", b"b0")]), (2, [(b"a", b"a1")])):
        data = batch(*rows)
        data[0:8] = base.to_bytes(8, "big")
        built = build_segment([data], created_ms=NOW)
        meta = SegmentMeta.from_info(built.info)
        at = meta.stored("default", "t", 0)
        store.put(at.key, built.data)
        store.put(at.index_key, built.index)
        segments.append(meta)
    job = Job("default", "t", 0, 4, 9, tuple(segments), 0, (), NOW, 86_400_000, 1 << 20, 1000)

    outcome = asyncio.run(ray_offload(BrokerConfig(data_dir=str(tmp_path)))(job, store))

    [replacement] = outcome.replacements
    assert replacement.old == tuple(segments) and replacement.new is not None
    assert (outcome.cleaned_to, outcome.stats.records_removed) == (3, 1)
    cleaned = SegmentReader(store.get(replacement.new.stored("default", "t", 0).key))
    assert [(h.base_offset, h.record_count) for _, h in cleaned.batches()] == [(0, 1), (2, 1)]  # b0, a1
