"""One handler per Kafka API the proxy serves, and the table the server dispatches on: API key → (versions,
handler). An API not in the table is not advertised, and a request for it closes the connection, as Kafka does
with an API it has not enabled."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from kafscale.proxy.handlers import (
    admin,
    api_versions,
    create_topics,
    fetch,
    find_coordinator,
    groups,
    init_producer_id,
    list_offsets,
    metadata,
    offsets,
    produce,
)
from kafscale.proxy.state import Call

Handler = Callable[[Call, Any], Awaitable[Any]]


def table() -> dict[int, tuple[int, int, Handler]]:
    handlers: dict[int, tuple[int, int, Handler]] = {}
    for module in (produce, fetch, list_offsets, metadata, find_coordinator, init_producer_id, create_topics):
        handlers[module.API_KEY] = (module.MIN_VERSION, module.MAX_VERSION, module.handle)
    for versions, handle in ((groups.VERSIONS, groups.handle), (offsets.VERSIONS, offsets.handle),
                             (admin.VERSIONS, admin.handle)):
        for key, (lo, hi) in versions.items():
            handlers[key] = (lo, hi, handle)
    ours = {key: (lo, hi) for key, (lo, hi, _) in handlers.items()}
    ours[api_versions.API_KEY] = (api_versions.MIN_VERSION, api_versions.MAX_VERSION)
    handlers[api_versions.API_KEY] = (api_versions.MIN_VERSION, api_versions.MAX_VERSION, api_versions.handler(ours))
    return handlers
