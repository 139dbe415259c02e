"""The proxy process: a Kafka listener whose requests are translated to an upstream cluster, and a /metrics
endpoint. One asyncio loop, no Ray, no stores of its own.

Each client connection is served one request at a time, in order, as Kafka serves a connection; it has its own
connections upstream (kafscale.proxy.upstream.Session). Bytes that are not a request the proxy serves close the
connection with a warning naming the client, as Kafka closes it; an upstream that cannot be reached closes it
too, and the client reconnects and retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from typing import Any

from aiohttp import web
from kio.schema.errors import ErrorCode
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kafscale.cluster.virtual import VirtualMapping
from kafscale.protocol.codec import decode_request, encode_response, make, request_class
from kafscale.protocol.errors import ProtocolError
from kafscale.protocol.header import parse_request_header
from kafscale.proxy.handlers import api_versions, table
from kafscale.proxy.producers import ProducerIds
from kafscale.proxy.state import Call, Proxy
from kafscale.proxy.topics import VirtualTopics
from kafscale.proxy.upstream import INIT_PRODUCER_ID_VERSION, Cluster, Session, UpstreamError

log = logging.getLogger("kafscale.proxy")
_SIZE = struct.Struct(">i")
MAX_FRAME = 100 * 1024 * 1024


class ProxyServer:
    def __init__(self, upstream: tuple[str, int], listen: tuple[str, int], mapping: VirtualMapping,
                 advertised: tuple[str, int] | None = None, metrics: tuple[str, int] | None = None) -> None:
        self.upstream, self.listen, self.mapping = upstream, listen, mapping
        self._advertised, self._metrics_address = advertised, metrics
        self.handlers = table()
        self.proxy: Proxy | None = None
        self.port = 0
        self.metrics_port = 0
        self._server: asyncio.Server | None = None
        self._metrics: web.AppRunner | None = None
        self._internal: Session | None = None
        self._connections: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, *self.listen)
        self.port = self._server.sockets[0].getsockname()[1]
        advertised = self._advertised or (self.listen[0], self.port)
        cluster = Cluster(self.upstream)
        self.proxy = Proxy(cluster, VirtualTopics(self.mapping), advertised)
        self._internal = internal = Session(cluster, "kafscale-proxy")
        self.proxy.producers = ProducerIds(lambda: _init_producer_id(internal))
        try:
            await internal.versions()
        except UpstreamError as e:
            log.warning("upstream %s:%d not reachable yet (%s); clients get errors until it is", *self.upstream, e)
        if self._metrics_address is not None:
            app = web.Application()
            app.router.add_get("/metrics", self._serve_metrics)
            self._metrics = web.AppRunner(app, access_log=None)
            await self._metrics.setup()
            site = web.TCPSite(self._metrics, *self._metrics_address)
            await site.start()
            self.metrics_port = self._metrics.addresses[0][1]
        log.info("proxy listening on %s:%d (advertised %s:%d), upstream %s:%d", self.listen[0], self.port,
                 *advertised, *self.upstream)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._connections.values():
            writer.close()  # each connection's loop ends at its next read or write
        if self._connections:
            _, late = await asyncio.wait(list(self._connections), timeout=5)
            for task in late:  # stuck upstream
                task.cancel()
        if self._internal is not None:
            await self._internal.close()
        if self._metrics is not None:
            await self._metrics.cleanup()

    async def _serve_metrics(self, _: web.Request) -> web.Response:
        assert self.proxy is not None
        return web.Response(body=generate_latest(self.proxy.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None and self.proxy is not None
        self._connections[task] = writer
        peer = writer.get_extra_info("peername")
        session = Session(self.proxy.cluster, None)
        try:
            while True:
                (size,) = _SIZE.unpack(await reader.readexactly(4))
                if not 0 < size <= MAX_FRAME:
                    log.warning("client %s sent a frame of %d bytes: connection closed", peer, size)
                    return
                payload = await reader.readexactly(size)
                frame = await self._answer(session, payload, peer)
                if frame is not None:
                    writer.write(frame)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, _Close):
            pass
        except asyncio.CancelledError:  # the proxy is stopping: end quietly, nothing waits on this task
            pass
        finally:
            self._connections.pop(task, None)
            await session.close()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, session: Session, payload: bytes, peer: Any) -> bytearray | None:
        """The response frame to a request (None: it has none); raises _Close to end the connection."""
        assert self.proxy is not None
        try:
            header = parse_request_header(payload)
        except ProtocolError as e:
            log.warning("client %s: %s: connection closed", peer, e)
            raise _Close from None
        session.client_id = header.client_id
        found = self.handlers.get(header.api_key)
        if found is None or not found[0] <= header.api_version <= found[1]:
            if header.api_key == api_versions.API_KEY:  # KIP-511: tell the client which versions we have
                answer = api_versions.answer(0, ErrorCode.unsupported_version, {
                    api_versions.API_KEY: (api_versions.MIN_VERSION, api_versions.MAX_VERSION)})
                return encode_response(header.correlation_id, answer)
            log.warning("client %s (%s) sent API %d v%d, which the proxy does not serve: connection closed",
                        peer, header.client_id, header.api_key, header.api_version)
            raise _Close
        try:
            request = decode_request(header.api_key, header.api_version, payload, header.size)
        except ProtocolError as e:
            log.warning("client %s (%s): %s: connection closed", peer, header.client_id, e)
            raise _Close from None
        name = type(request).__name__.removesuffix("Request")
        self.proxy.metrics.requests.labels(name).inc()
        try:
            response = await found[2](Call(self.proxy, session), request)
            return None if response is None else encode_response(header.correlation_id, response)
        except UpstreamError as e:
            self.proxy.metrics.upstream_errors.labels(name).inc()
            log.warning("%s for client %s (%s) failed upstream: %s: connection closed", name, peer,
                        header.client_id, e)
            raise _Close from None
        except Exception:
            log.exception("%s for client %s (%s) failed: connection closed", name, peer, header.client_id)
            raise _Close from None


class _Close(Exception):
    """End the client's connection."""


async def _init_producer_id(session: Session) -> tuple[int, int]:
    await session.versions()
    cls = request_class(22, session.cluster.version(22, INIT_PRODUCER_ID_VERSION))
    answer = await session.send(make(cls, transactional_id=None, transaction_timeout=60_000, producer_id=-1,
                                     producer_epoch=-1))
    if answer.error_code != 0:
        raise UpstreamError(f"upstream refused a producer id: {answer.error_code!r}")
    return answer.producer_id, answer.producer_epoch


async def run(server: ProxyServer) -> None:
    """Serve until cancelled."""
    await server.start()
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()
