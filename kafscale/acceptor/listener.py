"""The asyncio TCP listener every broker shard runs: it accepts connections, closes idle ones, and stops
gracefully. What happens on a connection (framing, header checks, pipelined dispatch, in-flight limits, what
closes it) is kafscale.acceptor.connection."""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Callable

from kafscale.acceptor.connection import Connection
from kafscale.acceptor.limits import ConnectionLimits
from kafscale.acceptor.router import Router
from kafscale.protocol.framing import DEFAULT_MAX_FRAME_BYTES, BufferPool
from kafscale.security.credentials import Credentials
from kafscale.security.sasl import SaslSession, SaslSettings
from kafscale.security.throttle import FailureThrottle
from kafscale.security.tls import ServerTls

__all__ = ["Listener", "PortInUse"]

log = logging.getLogger(__name__)


class PortInUse(OSError):
    """A listener's port is taken (by another process, or by a client socket that got it as its own port)."""

    def __init__(self, listener: str, host: str, port: int) -> None:
        super().__init__(errno.EADDRINUSE, f"the {listener} listener's port {host}:{port} is in use")
        self.listener, self.host, self.port = listener, host, port

    def __reduce__(self) -> tuple[type, tuple[str, str, int]]:  # it crosses Ray as a shard's start error
        return PortInUse, (self.listener, self.host, self.port)


TLS_HANDSHAKE_TIMEOUT_S = 10.0  # a client that opens a TLS connection and stalls is dropped after this


class Listener:
    def __init__(
        self,
        router: Router,
        host: str,
        port: int,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        advertised_host: str | None = None,
        max_in_flight: int = 1000,
        max_in_flight_bytes: int = 64 * 1024 * 1024,
        idle_timeout_s: float = 600.0,
        name: str = "PLAINTEXT",
        tls: ServerTls | None = None,
        sasl: SaslSettings | None = None,
        credentials: Credentials | None = None,
        limits: ConnectionLimits | None = None,
        request_read_timeout_s: float = 0.0,
        on_closed: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self.router = router
        self.name = name  # Metadata answers with the shards' addresses on the listener a request came in on
        self.tls = tls
        self.sasl = sasl
        if sasl is not None and credentials is None:
            raise ValueError(f"listener {name}: SASL needs the credentials")
        self.credentials = credentials
        self.auth_failures = FailureThrottle()
        self.limits = limits or ConnectionLimits()
        # A request must arrive whole within this long of its first byte (0: no limit): a client that drips
        # bytes cannot hold a connection, and its buffer, forever.
        self.request_read_timeout_s = request_read_timeout_s
        self.on_closed = on_closed  # why the broker closed a connection: metrics count it
        self.host = host
        self.port = port  # the bound port once start() returned (port 0 picks a free one)
        self.max_frame_bytes = max_frame_bytes
        if max_in_flight < 1 or max_in_flight_bytes < 1:
            raise ValueError(f"in-flight limits must be positive, got {max_in_flight} requests and "
                             f"{max_in_flight_bytes} bytes")
        self.max_in_flight = max_in_flight
        self.max_in_flight_bytes = max_in_flight_bytes
        # Kafka's connections.max.idle.ms: a connection with nothing in flight and no bytes in
        # either direction for this long is closed, so abandoned clients do not pile up.
        self.idle_timeout_s = idle_timeout_s
        self._sweeper: asyncio.Task[None] | None = None
        self._reloader: asyncio.Task[None] | None = None
        self._advertised_host = advertised_host
        self._server: asyncio.Server | None = None
        self._connections: set[Connection] = set()
        self._stopping = False
        self.buffers = BufferPool()  # receive buffers for large requests, shared by connections

    @property
    def advertised_host(self) -> str:
        """The host clients should be told to connect to (Metadata, FindCoordinator)."""
        return self._advertised_host or self.host

    def new_sasl_session(self) -> SaslSession | None:
        if self.sasl is None:
            return None
        assert self.credentials is not None
        return SaslSession(self.sasl, self.credentials)

    @property
    def connections(self) -> int:
        return len(self._connections)

    async def start(self) -> None:
        self._stopping = False
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(
                lambda: Connection(self), self.host, self.port, backlog=1024,
                ssl=self.tls.context if self.tls is not None else None,
                ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if self.tls is not None else None)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise PortInUse(self.name, self.host, self.port) from None
            raise
        self.port = self._server.sockets[0].getsockname()[1]
        if self.idle_timeout_s > 0:
            self._sweeper = loop.create_task(self._close_idle())
        if self.tls is not None:
            self._reloader = loop.create_task(self.tls.keep_current())
        log.info("listening on %s:%d (%s)", self.host, self.port, self.name)

    async def _close_idle(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(self.idle_timeout_s / 4, 30.0))
            now = loop.time()
            for conn in list(self._connections):
                if conn.idle_since(now) > self.idle_timeout_s:
                    log.info("%s: idle for over %.0f s; closing", conn, self.idle_timeout_s)
                    conn.stop_reading()

    async def stop(self, grace: float = 5.0) -> None:
        """Stop accepting, stop reading, let in-flight handlers finish and their responses be
        written for up to `grace` seconds, then cancel what is left and close every connection."""
        self._stopping = True
        for task in (self._sweeper, self._reloader):
            if task is not None:
                task.cancel()
        self._sweeper = self._reloader = None
        if self._server is not None:
            self._server.close()
        connections = list(self._connections)
        for conn in connections:
            conn.stop_reading()
        tasks = [conn.task for conn in connections if conn.task is not None]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=grace)
            for conn in connections:
                if conn.task in late:
                    conn.abort()
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
