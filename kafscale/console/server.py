"""The console's HTTP(S) server: one aiohttp site on the event loop of whoever hosts it (the controller)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from kafscale.config import BrokerConfig
from kafscale.console.api import ConsoleApi
from kafscale.console.credentials import LoginPolicy
from kafscale.console.kafka_clients import read_client_config
from kafscale.console.kafka_view import KafkaClusterView
from kafscale.console.view import Placement
from kafscale.security.tls import ServerTls, TlsSettings

log = logging.getLogger(__name__)


def console_address(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host or "127.0.0.1", int(port)


class ConsoleServer:
    def __init__(self, api: ConsoleApi, host: str, port: int, *, tls: ServerTls | None = None) -> None:
        self.api = api
        self.host = host
        self.port = port  # the bound port after start() (0 picks a free one)
        self.tls = tls
        self._runner: web.AppRunner | None = None
        self._reloader: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}/"

    async def start(self) -> None:
        self._runner = web.AppRunner(self.api.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port,
                           ssl_context=self.tls.context if self.tls is not None else None)
        await site.start()
        server = site._server  # aiohttp exposes the bound sockets only here
        if server is not None and getattr(server, "sockets", None):
            self.port = server.sockets[0].getsockname()[1]
        if self.tls is not None:
            self._reloader = asyncio.get_running_loop().create_task(self.tls.keep_current())
        reason = self.api.policy.disabled_reason
        log.info("console on %s%s", self.url, f" ({reason})" if reason else "")

    async def stop(self) -> None:
        if self._reloader is not None:
            self._reloader.cancel()
            self._reloader = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await asyncio.to_thread(self.api.view.close)  # may wait for a test message in flight


async def start_console(config: BrokerConfig, environ: Mapping[str, str], bootstrap: Callable[[], str],
                        overview: Callable[[], Awaitable[dict[str, Any]]],
                        placement: Placement | None = None) -> ConsoleServer | None:
    """The console as configured (None with --no-console): HTTPS with the listeners' certificate when there is
    one, logins as `environ` allows (kafscale.console.credentials)."""
    if not config.console:
        return None
    host, port = console_address(config.console_listen)
    tls = ServerTls(TlsSettings(config.ssl_certfile, config.ssl_keyfile)) if config.ssl_certfile else None
    view = KafkaClusterView(bootstrap, read_client_config(config.console_client_config), overview, placement)
    links = {"ray_dashboard": f"http://127.0.0.1:{config.dashboard_port}"} if config.dashboard else {}
    api = ConsoleApi(view, LoginPolicy.from_env(environ), secure_cookies=tls is not None, links=links)
    server = ConsoleServer(api, host, port, tls=tls)
    await server.start()
    return server
