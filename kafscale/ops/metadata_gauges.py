"""The metadata store's size and history as Ray metrics, set by the controller's compactor after each round
(the Ray dashboard and Ray's Prometheus endpoint show them, with the autoscaler's figures)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from kafscale.storage.compaction import CompactionState

GAUGES = {
    "kafscale_metadata_revision": "The metadata store's current revision",
    "kafscale_metadata_db_bytes": "The metadata store's database size on disk (etcd's dbSize, or the SQLite files)",
    "kafscale_metadata_compacted_revision": "The oldest revision the last compaction kept",
    "kafscale_metadata_history_revisions": "Revisions kept behind the current one (the compaction lag)",
}


def metadata_gauges() -> Callable[[CompactionState], None]:
    made: dict[str, Any] = {}

    def report(state: CompactionState) -> None:
        values = {"kafscale_metadata_revision": state.status.revision,
                  "kafscale_metadata_db_bytes": state.status.db_bytes,
                  "kafscale_metadata_compacted_revision": state.compacted_revision,
                  "kafscale_metadata_history_revisions": state.history_revisions}
        with contextlib.suppress(Exception):  # outside Ray (a test's compactor) there is nowhere to report
            from ray.util import metrics

            for name, value in values.items():
                if name not in made:
                    made[name] = metrics.Gauge(name, description=GAUGES[name])
                made[name].set(value)

    return report
