"""The console beside an in-process broker (tests), and the Chromium that Playwright drives through it."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Mapping
from typing import Any

from kafscale.cluster import placement_store as store
from kafscale.cluster.layout import layout
from kafscale.console.server import ConsoleServer, start_console
from kafscale.testing.inprocess import InProcessBroker

CHROMIUM_NAMES = ("chromium", "chromium-browser")


def console_beside(broker: InProcessBroker, environ: Mapping[str, str], **settings: Any) -> ConsoleServer:
    """A console on a free port of 127.0.0.1, on the broker's event loop, reading the broker's layout."""
    config = dataclasses.replace(broker.config, console=True, console_listen="127.0.0.1:0", **settings)

    async def overview() -> dict[str, Any]:
        assert broker.meta is not None
        if await store.live_shards(broker.meta):
            return await layout(broker.meta)
        # A standalone in-process shard registers nowhere (there is no controller to tell): it is the cluster.
        infos = await store.topics(broker.meta)
        port = int(broker.bootstrap.rsplit(":", 1)[1])
        shard = {"id": 0, "node_id": "in-process", "node_ip": "127.0.0.1", "host": "127.0.0.1", "port": port,
                 "live": True, "draining": False, "group_slots": [], "groups": [],
                 "partitions": [f"{t}-{p}" for t, info in sorted(infos.items()) for p in range(info.partitions)]}
        return {"nodes": [{"node_id": "in-process", "node_ip": "127.0.0.1", "shards": [shard]}]}

    async def start() -> ConsoleServer:
        server = await start_console(config, environ, lambda: broker.bootstrap, overview)
        assert server is not None
        return server

    return broker.run(start())


def stop_console(broker: InProcessBroker, server: ConsoleServer) -> None:
    broker.run(server.stop())


def chromium_path() -> str:
    """Debian's Chromium (scripts/install-system-deps.sh installs it): Playwright downloads no browser here."""
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    raise FileNotFoundError("no Chromium on PATH: `make test` installs Debian's chromium (scripts/"
                            "install-system-deps.sh)")
