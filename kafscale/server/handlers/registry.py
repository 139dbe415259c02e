"""Every API a shard serves, registered on its router (ApiVersions advertises exactly these)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafscale.server.handlers import (
    alter_configs,
    create_partitions,
    create_topics,
    delete_groups,
    delete_records,
    delete_topics,
    describe_cluster,
    describe_configs,
    describe_groups,
    fetch,
    find_coordinator,
    heartbeat,
    incremental_alter_configs,
    init_producer_id,
    join_group,
    leave_group,
    list_groups,
    list_offsets,
    metadata,
    offset_commit,
    offset_delete,
    offset_fetch,
    offset_for_leader_epoch,
    produce,
    sync_group,
)
from kafscale.server.router import Router

if TYPE_CHECKING:
    from kafscale.broker.shard import ShardCore

MODULES = (produce, fetch, list_offsets, metadata, create_topics, delete_topics, init_producer_id, find_coordinator)
# Operations (docs/operations.md): admin APIs.
MODULES += (create_partitions, describe_configs, alter_configs, incremental_alter_configs, offset_for_leader_epoch,
            describe_cluster, delete_records)
# Consumer groups (docs/groups.md).
MODULES += (join_group, sync_group, heartbeat, leave_group, offset_commit, offset_fetch, offset_delete, describe_groups,
            list_groups, delete_groups)


def register_all(router: Router, shard: ShardCore) -> None:
    for module in MODULES:
        module.register(router, shard)
