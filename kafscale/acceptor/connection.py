"""One client connection of a shard's listener: framing, header checks, pipelined dispatch.

Each connection is an asyncio.BufferedProtocol plus one writer task, and one answer per request:

* reading is callback-driven: the transport receives straight into the FrameAssembler's
  buffers (protocol/framing.py: a large produce request lands in a pooled buffer, copied once);
  each complete frame is parsed, its body decoded and its handler started right away (a task of
  its own, or for Produce a future the shard completes from callbacks: `Router.start`), so a
  long-polling Fetch does not hold up a Produce sent after it on the same connection;
* the writer task awaits those answers strictly in arrival order and writes their responses,
  because Kafka clients match responses to requests by order (Kafka itself serves one request
  per connection at a time, muting the socket meanwhile). A handler returning None (acks=0)
  produces no bytes and the writer moves straight on. Responses that are ready together go out
  in one write; writing waits while the transport's buffer is above its high-water mark (the
  protocol-level equivalent of StreamWriter.drain()).

A connection stops taking frames once `max_in_flight` requests are read but not yet answered, or once
their frames add up to `max_in_flight_bytes`; it pauses reading, TCP fills up and the client slows down.
So a connection holds at most the byte budget plus one request, and a request is always taken when
nothing else is in flight, whatever its size. The byte budget is the one that matters for memory
(responses are not counted: clients keep one Fetch per broker in flight). The count is generous
because librdkafka pipelines one Produce per partition per linger, and an acks=all Produce stays in
flight until its flush commits: with 16 partitions on S3 that is hundreds of small requests (100 of
them held the client back by a quarter, docs/performance.md).

What closes a connection (after the responses to earlier requests have been written, which is
what a client of Kafka would also have received) — each logged as a warning naming the client:

* size prefix < 0 or > max_frame_bytes: checked before anything is allocated (Kafka's
  InvalidReceiveException);
* a header that does not parse, an unknown API key, or a version outside the registered range
  of an API: Kafka's SocketServer closes the connection for these too ("Received request api
  key … which is not enabled"), it does not answer. ApiVersions is the exception: any version
  is accepted, one we do not support gets a v0 UNSUPPORTED_VERSION answer (see
  handlers/api_versions.py);
* a body that does not decode (truncated, garbage, inconsistent lengths): Kafka closes on the
  InvalidRequestException from RequestContext.parseRequest;
* on a SASL listener, a request before authentication completed or after the session expired, and a failed
  authentication once its answer is written (kafscale.acceptor.sasl_gate);
* end of stream from the client: handlers already started still run to completion (an acks=0
  produce that was received is not lost), their responses are attempted, then the connection
  closes;
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
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from kafscale.acceptor import sasl_gate
from kafscale.acceptor.blocked_producers import WaitingProduces
from kafscale.acceptor.handlers import api_versions
from kafscale.acceptor.router import RequestContext
from kafscale.protocol.codec import encode_response
from kafscale.protocol.errors import InvalidFrameSize, ProtocolError
from kafscale.protocol.framing import FrameAssembler
from kafscale.protocol.header import parse_request_header
from kafscale.protocol.produce_codec import EncodedResponse
from kafscale.security.principal import ANONYMOUS

if TYPE_CHECKING:
    from kafscale.acceptor.listener import Listener

log = logging.getLogger("kafscale.acceptor.listener")  # one logger for the listener and its connections

_connection_ids = itertools.count(1)

_CLOSE_TIMEOUT = 5.0  # seconds to flush the last responses to a client before aborting
# Responses coalesced into one write when pipelined requests finish together; small enough
# that the first of them is not noticeably delayed by encoding the rest.
_MAX_BATCH = 8
_SASL_HANDSHAKE, _SASL_AUTHENTICATE = sasl_gate.SASL_HANDSHAKE, sasl_gate.SASL_AUTHENTICATE
_RAW_TOKEN = -1  # a pending answer that is a bare SASL token (after a v0 SaslHandshake), framed by its length
_SASL_KEYS = (_SASL_HANDSHAKE, _SASL_AUTHENTICATE, _RAW_TOKEN)


class _Pending(NamedTuple):
    task: asyncio.Future[Any]  # the handler's answer: a task, or a future it completes itself
    correlation_id: int
    api_key: int
    api_version: int
    response_version: int  # == api_version, except 0 for the ApiVersions fallback
    size: int  # bytes of the request frame, counted against max_in_flight_bytes until answered


class Connection(asyncio.BufferedProtocol):
    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self.router = listener.router
        self.id = next(_connection_ids)
        self.host = "?"
        self.port = 0
        self.client_id: str | None = None  # last seen, for log messages
        self.task: asyncio.Task[None] | None = None  # the writer; its end is the connection's end
        self.transport: asyncio.Transport | None = None
        self._frames = FrameAssembler(listener.max_frame_bytes, pool=listener.buffers)
        self._max_in_flight = listener.max_in_flight
        self._max_in_flight_bytes = listener.max_in_flight_bytes
        self._pending: asyncio.Queue[_Pending | None] = asyncio.Queue()
        self._in_flight = 0  # requests started and not yet answered
        self._in_flight_bytes = 0  # their frames' sizes
        self._reading = True  # False once no further request will be taken
        self._read_paused = False  # paused because of the in-flight limits
        self._writable = asyncio.Event()
        self._writable.set()
        self._lost = False
        self._closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._aborted = False
        self._last_active = asyncio.get_running_loop().time()
        self.principal = ANONYMOUS  # PLAINTEXT, or SSL without a client certificate; SASL sets its own
        self.sasl = listener.new_sasl_session()  # None unless the listener is SASL_PLAINTEXT or SASL_SSL
        self._admitted = False  # counted against max_connections_per_ip
        self._read_timer: asyncio.TimerHandle | None = None  # runs while a request has only partly arrived
        self.produce_waits = WaitingProduces()

    def __str__(self) -> str:
        who = f"{self.host}:{self.port}"
        if self.client_id:
            who += f" (client id {self.client_id!r})"
        return f"{who} [connection {self.id}]"

    # ---------------------------------------------------------------- asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername") or ("?", 0)
        self.host, self.port = str(peer[0]), int(peer[1])
        if self.listener._stopping:
            self._reading = False
            self.transport.abort()
            return
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # Responses are written whole; Nagle would only delay the last segment of each.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not self.listener.limits.admit(self.host):
            log.warning("%s: over max_connections_per_ip (%d from this address); closing", self,
                        self.listener.limits.max_per_ip)
            self.listener.on_closed("max_connections_per_ip")
            self._reading = False
            self.transport.abort()
            return
        self._admitted = True
        if self.listener.tls is not None and self.sasl is None:  # SSL: who the client certificate says
            self.principal = self.listener.tls.principal(transport.get_extra_info("ssl_object"))
        self.listener._connections.add(self)
        self.task = asyncio.get_running_loop().create_task(self._write_loop())

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._frames.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self._last_active = asyncio.get_running_loop().time()
        self._frames.buffer_updated(nbytes)
        self._take_frames()
        if self.listener.request_read_timeout_s > 0:
            self._time_partial_request()

    def eof_received(self) -> bool:
        if self._reading and self._frames.buffered:
            log.warning("%s: connection closed inside a request (%d bytes of it received)",
                        self, self._frames.buffered)
        self._stop_reading()
        # Keep the transport: answers to requests already read are still owed. TLS has no half-close: there the
        # transport closes after this whatever it returns (and asyncio warns about a True).
        return self.listener.tls is None

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if self._admitted:
            self._admitted = False
            self.listener.limits.release(self.host)
        if self._read_timer is not None:
            self._read_timer.cancel()
        self._writable.set()  # wake a writer waiting for the buffer to drain; it will see _lost
        self._stop_reading()
        if not self._closed.done():
            self._closed.set_result(None)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # ---------------------------------------------------------------- control

    def stop_reading(self) -> None:
        """Take no further requests; the writer still answers those already taken."""
        self._stop_reading()

    def idle_since(self, now: float) -> float:
        """Seconds without a byte in either direction; 0 while a request is in flight."""
        return 0.0 if self._in_flight else now - self._last_active

    def abort(self) -> None:
        """Drop everything: cancel handlers and the writer, reset the socket."""
        self._aborted = True
        self._stop_reading()
        if self.task is not None:
            self.task.cancel()
        self._cancel_pending()
        if self.transport is not None:
            self.transport.abort()
        self.listener._connections.discard(self)  # also when the writer never got to run

    def _stop_reading(self) -> None:
        if not self._reading:
            return
        self._reading = False
        if self.transport is not None and not self._lost:
            self.transport.pause_reading()
        self._pending.put_nowait(None)  # the writer ends after the responses before this

    # ---------------------------------------------------------------- reading

    def _take_frames(self) -> None:
        """Start handlers for complete frames, up to the in-flight limit, and pause or resume
        reading to match."""
        try:
            while self._reading and not self._full():
                payload = self._frames.next_frame()
                if payload is None:
                    break
                if not self._accept(payload):
                    self._stop_reading()
                    return
        except InvalidFrameSize as e:
            log.warning("%s: frame size %d outside 0..%d (socket.request.max.bytes); closing",
                        self, e.size, e.max_size)
            self._stop_reading()
            return
        except Exception:  # a bug here must cost this connection, not the listener
            log.exception("%s: unexpected error while reading; closing", self)
            self._stop_reading()
            return
        if not self._reading or self.transport is None:
            return
        full = self._full()
        if full != self._read_paused:
            self._read_paused = full
            if full:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def _time_partial_request(self) -> None:
        """A timer runs while part of a request has arrived and reading goes on (paused reading holds whole
        requests back, not the client's)."""
        partial = self._reading and not self._read_paused and self._frames.buffered > 0
        if partial and self._read_timer is None:
            self._read_timer = asyncio.get_running_loop().call_later(self.listener.request_read_timeout_s,
                                                                     self._read_timed_out)
        elif not partial and self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        log.warning("%s: a request did not arrive whole within %.0f ms (%d bytes of it received); closing", self,
                    self.listener.request_read_timeout_s * 1000, self._frames.buffered)
        self.listener.on_closed("request_read_timeout")
        self._stop_reading()

    def _full(self) -> bool:
        return self._in_flight >= self._max_in_flight or (
            self._in_flight > 0 and self._in_flight_bytes >= self._max_in_flight_bytes)

    def _accept(self, payload: bytes | memoryview) -> bool:
        """Parse one request and start its handler; False means close the connection."""
        if self.sasl is not None and self.sasl.raw_tokens:
            return self._accept_token(bytes(payload))
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
        if route.min_version <= api_version <= route.max_version:
            try:
                request = route.decode(api_key, api_version, payload, header.size)
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
                self, api_key, api_version, route.min_version, route.max_version,
            )
            return False
        if self.sasl is not None and not sasl_gate.admits(self.sasl, api_key, api_version, self):
            return False
        ctx = RequestContext(
            api_key, api_version, header.correlation_id, header.client_id,
            self.host, self.port, self.id, self.listener,
            self.sasl.principal or ANONYMOUS if self.sasl is not None else self.principal, self.sasl,
            self.produce_waits,
        )
        task = self.router.start(ctx, request)
        self._in_flight += 1
        self._in_flight_bytes += len(payload)
        self._pending.put_nowait(
            _Pending(task, header.correlation_id, api_key, api_version, response_version, len(payload))
        )
        return True

    def _accept_token(self, token: bytes) -> bool:
        """A bare SASL token after a v0 SaslHandshake: the exchange's next step, answered as a bare token."""
        assert self.sasl is not None
        step = sasl_gate.token_step(self.sasl, token, self.listener.auth_failures, self.host, self,
                                    self.listener.on_closed)
        task = asyncio.get_running_loop().create_task(step)
        self._in_flight += 1
        self._in_flight_bytes += len(token)
        self._pending.put_nowait(_Pending(task, 0, _RAW_TOKEN, 0, 0, len(token)))
        return True

    # ---------------------------------------------------------------- writing

    async def _write_loop(self) -> None:
        # Anything gathered is flushed before waiting on a handler that has not finished, so a
        # slow request never holds back the answers before it.
        pending = self._pending
        out: list[bytes | bytearray] = []
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
                self._in_flight -= 1
                self._in_flight_bytes -= item.size
                if item.api_key in _SASL_KEYS and self.sasl is not None and self.sasl.failed:
                    return  # this answered a failure: written below, then the connection closes
                if self._read_paused:
                    self._take_frames()
        except OSError as e:
            log.debug("%s: write failed: %s", self, e)
        finally:
            if out and not self._lost and not self._aborted:
                # Answers to the requests before a failure are still owed to the client.
                self._write(b"".join(out))
            self._stop_reading()
            self._cancel_pending()
            await self._close()
            self._frames.close()
            self.listener._connections.discard(self)

    def _write(self, data: bytes | bytearray) -> None:
        assert self.transport is not None
        self._last_active = asyncio.get_running_loop().time()
        self.transport.write(data)

    async def _flush(self, out: list[bytes | bytearray]) -> None:
        if self._lost:
            raise ConnectionResetError("connection lost")
        self._write(out[0] if len(out) == 1 else b"".join(out))
        out.clear()
        if not self._writable.is_set():
            await self._writable.wait()
            if self._lost:
                raise ConnectionResetError("connection lost")

    def _encode(self, item: _Pending, response: Any) -> bytes | bytearray | None:
        if item.api_key == _RAW_TOKEN:
            return cast(bytes, response)
        if isinstance(response, EncodedResponse):
            key, version = response.api_key, response.api_version
        else:
            key, version = getattr(type(response), "__api_key__", None), getattr(type(response), "__version__", None)
        if (key, version) != (item.api_key, item.response_version):
            log.error("%s: handler for API key %d v%d returned %s, not its response; closing",
                      self, item.api_key, item.api_version, type(response).__qualname__)
            return None
        if isinstance(response, EncodedResponse):
            return response.frame
        try:
            return encode_response(item.correlation_id, response)
        except Exception:
            log.exception("%s: cannot encode the response to API key %d v%d; closing",
                          self, item.api_key, item.api_version)
            return None

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
        transport = self.transport
        if transport is None:
            return
        if self._aborted or self._lost:
            transport.abort()
            return
        transport.close()  # sends what is buffered first
        try:
            await asyncio.wait_for(asyncio.shield(self._closed), _CLOSE_TIMEOUT)
        except TimeoutError:
            transport.abort()
        except asyncio.CancelledError:
            transport.abort()
            raise
