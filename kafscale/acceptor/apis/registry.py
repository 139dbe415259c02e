"""Every API a shard serves, registered on its router (ApiVersions advertises exactly these)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafscale.acceptor.apis import (
    create_topics,
    delete_topics,
    fetch,
    find_coordinator,
    init_producer_id,
    list_offsets,
    metadata,
    produce,
)
from kafscale.acceptor.router import Router

if TYPE_CHECKING:
    from kafscale.actors.shard import ShardCore

MODULES = (produce, fetch, list_offsets, metadata, create_topics, delete_topics, init_producer_id, find_coordinator)


def register_all(router: Router, shard: ShardCore) -> None:
    for module in MODULES:
        module.register(router, shard)
