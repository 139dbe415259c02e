"""A shard's periodic chores, each its own loop: retention, producer-id expiry, the log cleaner, the janitor,
scheduled metadata snapshots. None of them is on the data path; each logs its failures and tries again at its next
round."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from kafscale.broker import cleaning, janitor, producer_expiry, retention, snapshot

if TYPE_CHECKING:
    from kafscale.broker.shard import ShardCore


def chores(core: ShardCore) -> list[Coroutine[Any, Any, None]]:
    config, owners = core.config, (lambda: core.owners.values())
    out = [retention.run(lambda: core.owners, config.retention_check_interval_ms / 1000),
           producer_expiry.run(owners, config.producer_id_expiration_check_interval_ms / 1000,
                               config.producer_id_expiration_ms),
           cleaning.run(owners, cleaning.CleanerSettings(config.log_cleaner_backoff_ms / 1000,
                                                         config.compaction_map_entries), core.offload,
                        core.metrics)]
    if config.janitor_interval_s:
        out.append(janitor.run(owners, core.placement.leads_housekeeping, core.meta, core.objects,
                               config.s3_namespace, config.janitor_interval_s, config.orphan_grace_s,
                               lambda sweep: core.metrics.swept(sweep.deleted, sweep.in_grace),
                               lambda topic: info.partitions if (info := core.topics.topics.get(topic)) else 0))
    if config.metadata_snapshot_interval_s:
        out.append(snapshot.run(core.meta, core.objects, config.s3_namespace, config.metadata_snapshot_interval_s,
                                config.metadata_snapshots_kept, core.placement.leads_housekeeping,
                                lambda taken: core.metrics.snapshot(taken.created_ms if taken else None)))
    return out
