"""A `kafscale proxy` on a loop of its own thread, for tests: in front of any broker, with a mapping given as
YAML text."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import yaml

from kafscale.cluster.virtual import VirtualMapping
from kafscale.proxy.server import ProxyServer


@contextmanager
def running_proxy(upstream: str, mapping: str) -> Iterator[str]:
    """Yields the proxy's bootstrap address (127.0.0.1, a free port); stops it on the way out."""
    host, port = upstream.rsplit(":", 1)
    server = ProxyServer((host, int(port)), ("127.0.0.1", 0), VirtualMapping.parse(yaml.safe_load(mapping)))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True, name="kafscale-proxy")
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(20)
        yield f"127.0.0.1:{server.port}"
    finally:
        try:
            asyncio.run_coroutine_threadsafe(server.stop(), loop).result(20)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()
