"""The asyncio TCP listener every broker shard runs: framing, header checks, pipelined dispatch.

Per connection there are two tasks and one task per request:

* the reader reads a frame, parses the header, decodes the body and starts the request's
  handler as its own task right away, so a long-polling Fetch does not hold up a Produce
  sent after it on the same connection;
* the writer awaits those tasks strictly in arrival order and writes their responses, because
  Kafka clients match responses to requests by order (Kafka itself serves one request per
  connection at a time, muting the socket meanwhile). A handler returning None (acks=0)
  produces no bytes and the writer moves straight on.

At most `max_in_flight` requests per connection are read but not yet answered; beyond that the
reader stops reading, TCP fills up and the client slows down.

What closes a connection (after the responses to earlier requests have been written, which is
what a client of Kafka would also have received) — each logged as a warning naming the client:

* size prefix < 0 or > max_frame_bytes: checked before anything is allocated (Kafka's
  InvalidReceiveException);
* a header that does not parse, an unknown API key, or a version outside the registered range
  of an API: Kafka's SocketServer closes the connection for these too ("Received request api
  key … which is not enabled"), it does not answer. ApiVersions is the exception: any version
  is accepted, one we do not support gets a v0 UNSUPPORTED_VERSION answer (see
  apis/api_versions.py);
* a body that does not decode (truncated, garbage, inconsistent lengths): Kafka closes on the
  InvalidRequestException from RequestContext.parseRequest;
* a handler that raises, or returns something that is not a response of the request's API and
  version: logged with the traceback, connection closed. Kafka would answer with the request
  type's generic error response, but that needs per-API knowledge of how to echo the request's
  topics and partitions with an error code; closing makes every client reconnect and retry,
  which is correct if slower, and handlers are expected to turn expected failures into error
  codes themselves.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
from typing import Any, NamedTuple

from kafscale.acceptor.apis import api_versions
from kafscale.acceptor.router import RequestContext, Router
from kafscale.protocol.codec import decode_request, encode_response
from kafscale.protocol.errors import ProtocolError
from kafscale.protocol.framing import DEFAULT_MAX_FRAME_BYTES
from kafscale.protocol.header import parse_request_header

__all__ = ["Listener"]

log = logging.getLogger(__name__)

_connection_ids = itertools.count(1)

# StreamReader buffer limit: reading pauses when 2× this is buffered and unread, so it bounds
# the memory of a connection under back-pressure while still moving large produce frames in
# few wake-ups.
_STREAM_LIMIT = 1024 * 1024
_CLOSE_TIMEOUT = 5.0  # seconds to flush the last responses to a client before aborting
# Responses coalesced into one write when pipelined requests finish together; small enough
# that the first of them is not noticeably delayed by encoding the rest.
_MAX_BATCH = 8


class Listener:
    def __init__(
        self,
        router: Router,
        host: str,
        port: int,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        advertised_host: str | None = None,
        max_in_flight: int = 100,
    ) -> None:
        self.router = router
        self.host = host
        self.port = port  # the bound port once start() returned (port 0 picks a free one)
        self.max_frame_bytes = max_frame_bytes
        self.max_in_flight = max_in_flight
        self._advertised_host = advertised_host
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._stopping = False

    @property
    def advertised_host(self) -> str:
        """The host clients should be told to connect to (Metadata, FindCoordinator)."""
        return self._advertised_host or self.host

    @property
    def connections(self) -> int:
        return len(self._connections)

    async def start(self) -> None:
        self._stopping = False
        self._server = await asyncio.start_server(
            self._on_client, self.host, self.port, limit=_STREAM_LIMIT, backlog=1024
        )
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("listening on %s:%d", self.host, self.port)

    async def stop(self, grace: float = 5.0) -> None:
        """Stop accepting, stop reading, let in-flight handlers finish and their responses be
        written for up to `grace` seconds, then cancel what is left and close every connection."""
        self._stopping = True
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

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._stopping:
            writer.transport.abort()
            return
        conn = _Connection(self, reader, writer)
        self._connections.add(conn)
        try:
            await conn.run()
        except asyncio.CancelledError:
            # Only the loop shutting down cancels this task, and the connection is closed by
            # now. Python 3.11's start_server calls exception() on this task when it ends,
            # which raises and logs a spurious error for a cancelled task, so end normally.
            pass
        finally:
            self._connections.discard(conn)


class _Pending(NamedTuple):
    task: asyncio.Task[Any]
    correlation_id: int
    api_key: int
    api_version: int
    response_version: int  # == api_version, except 0 for the ApiVersions fallback


class _Connection:
    def __init__(
        self, listener: Listener, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.listener = listener
        self.router = listener.router
        self.reader = reader
        self.writer = writer
        self.id = next(_connection_ids)
        peer = writer.get_extra_info("peername") or ("?", 0)
        self.host: str = str(peer[0])
        self.port: int = int(peer[1])
        self.client_id: str | None = None  # last seen, for log messages
        self.task: asyncio.Task[Any] | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._writer_task: asyncio.Task[None] | None = None
        self._pending: asyncio.Queue[_Pending | None] = asyncio.Queue()
        self._slots = asyncio.Semaphore(listener.max_in_flight)
        self._aborted = False
        sock = writer.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # Responses are written whole; Nagle would only delay the last segment of each.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def __str__(self) -> str:
        who = f"{self.host}:{self.port}"
        if self.client_id:
            who += f" (client id {self.client_id!r})"
        return f"{who} [connection {self.id}]"

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        self._reader_task = loop.create_task(self._read_loop())
        self._writer_task = loop.create_task(self._write_loop())
        try:
            # wait() rather than await: the writer ending by cancellation (abort) is normal here.
            await asyncio.wait((self._writer_task,))
        except asyncio.CancelledError:
            self.abort()
            raise
        finally:
            self._reader_task.cancel()
            self._cancel_pending()
            await self._close()

    def stop_reading(self) -> None:
        """Read no further requests; the writer still answers those already read."""
        if self._reader_task is not None:
            self._reader_task.cancel()

    def abort(self) -> None:
        """Drop everything: cancel handlers and the writer, reset the socket."""
        self._aborted = True
        if self._reader_task is not None:
            self._reader_task.cancel()
        if self._writer_task is not None:
            self._writer_task.cancel()
        self._cancel_pending()
        self.writer.transport.abort()

    def _cancel_pending(self) -> None:
        while not self._pending.empty():
            item = self._pending.get_nowait()
            if item is None:
                continue
            if not item.task.done():
                item.task.cancel()
            elif not item.task.cancelled() and item.task.exception() is not None:
                # Nobody will await it now; log it here rather than as "never retrieved".
                log.warning("%s: handler for API key %d v%d failed after the connection closed: %r",
                            self, item.api_key, item.api_version, item.task.exception())

    async def _close(self) -> None:
        if self._aborted:
            self.writer.transport.abort()
            return
        self.writer.close()
        try:
            await asyncio.wait_for(self.writer.wait_closed(), _CLOSE_TIMEOUT)
        except (TimeoutError, OSError):
            self.writer.transport.abort()
        except asyncio.CancelledError:
            self.writer.transport.abort()
            raise

    # ---------------------------------------------------------------- reading

    async def _read_loop(self) -> None:
        reader = self.reader
        max_frame = self.listener.max_frame_bytes
        slots = self._slots
        try:
            while True:
                await slots.acquire()
                try:
                    prefix = await reader.readexactly(4)
                except asyncio.IncompleteReadError as e:
                    if e.partial:
                        log.warning("%s: connection closed inside a size prefix", self)
                    return
                size = int.from_bytes(prefix, "big", signed=True)
                if size < 0 or size > max_frame:
                    log.warning(
                        "%s: frame size %d outside 0..%d (socket.request.max.bytes); closing",
                        self, size, max_frame,
                    )
                    return
                try:
                    payload = await reader.readexactly(size)
                except asyncio.IncompleteReadError as e:
                    log.warning("%s: connection closed after %d of %d frame bytes",
                                self, len(e.partial), size)
                    return
                if not self._accept(payload):
                    return
        except OSError as e:  # reset by peer and the like
            log.debug("%s: read failed: %s", self, e)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s: unexpected error while reading; closing", self)
        finally:
            self._pending.put_nowait(None)

    def _accept(self, payload: bytes) -> bool:
        """Parse one request and start its handler; False means close the connection."""
        try:
            header = parse_request_header(payload)
        except ProtocolError as e:
            log.warning("%s: bad request header: %s; closing", self, e)
            return False
        api_key = header.api_key
        api_version = header.api_version
        if header.client_id:
            self.client_id = header.client_id
        route = self.router.lookup(api_key)
        if route is None:
            log.warning("%s: unknown API key %d (version %d); closing", self, api_key, api_version)
            return False
        min_version, max_version, _ = route
        if min_version <= api_version <= max_version:
            try:
                request = decode_request(api_key, api_version, payload, header.size)
            except ProtocolError as e:
                log.warning("%s: %s; closing", self, e)
                return False
            response_version = api_version
        elif api_key == api_versions.API_KEY:
            log.info("%s: ApiVersions v%d is newer than we support; answering v0 UNSUPPORTED_VERSION",
                     self, api_version)
            request = api_versions.UNSUPPORTED_VERSION_REQUEST
            response_version = 0
        else:
            log.warning(
                "%s: API key %d version %d is not supported (supported %d..%d); closing",
                self, api_key, api_version, min_version, max_version,
            )
            return False
        ctx = RequestContext(
            api_key, api_version, header.correlation_id, header.client_id,
            self.host, self.port, self.id, self.listener,
        )
        task = asyncio.get_running_loop().create_task(self.router.dispatch(ctx, request))
        self._pending.put_nowait(
            _Pending(task, header.correlation_id, api_key, api_version, response_version)
        )
        return True

    # ---------------------------------------------------------------- writing

    async def _write_loop(self) -> None:
        # Responses that are ready back to back (pipelined requests) go out in one write: one
        # send() per response was the largest cost in a profile of small produce requests.
        # Anything gathered is flushed before waiting on a handler that has not finished, so a
        # slow request never holds back the answers before it.
        writer = self.writer
        pending = self._pending
        out: list[bytes] = []
        try:
            while True:
                if out and (pending.empty() or len(out) >= _MAX_BATCH):
                    await self._flush(out)
                item = await pending.get()
                if item is None:
                    return
                if out and not item.task.done():
                    await self._flush(out)
                try:
                    response = await item.task
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        raise
                    log.warning("%s: handler for API key %d v%d (correlation id %d) was cancelled; closing",
                                self, item.api_key, item.api_version, item.correlation_id)
                    return
                except Exception:
                    log.exception("%s: handler for API key %d v%d (correlation id %d) failed; closing",
                                  self, item.api_key, item.api_version, item.correlation_id)
                    return
                if response is not None:
                    frame = self._encode(item, response)
                    if frame is None:
                        return
                    out.append(frame)
                self._slots.release()
        except OSError as e:
            log.debug("%s: write failed: %s", self, e)
        finally:
            if out and not writer.is_closing():
                # Answers to the requests before a failure are still owed to the client.
                writer.write(b"".join(out))

    async def _flush(self, out: list[bytes]) -> None:
        self.writer.write(out[0] if len(out) == 1 else b"".join(out))
        out.clear()
        await self.writer.drain()

    def _encode(self, item: _Pending, response: Any) -> bytes | None:
        cls = type(response)
        if (getattr(cls, "__api_key__", None), getattr(cls, "__version__", None)) != (
            item.api_key, item.response_version
        ):
            log.error("%s: handler for API key %d v%d returned %s, not its response; closing",
                      self, item.api_key, item.api_version, cls.__qualname__)
            return None
        try:
            return encode_response(item.correlation_id, response)
        except Exception:
            log.exception("%s: cannot encode the response to API key %d v%d; closing",
                          self, item.api_key, item.api_version)
            return None
