"""The listener over real sockets: real clients negotiate, requests pipeline, garbage is contained.

The listener runs on its own event loop in a background thread, so that blocking clients
(confluent-kafka, kafka-python, raw sockets, kcat via subprocess) can talk to it from the test.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafscale.acceptor import Listener, RequestContext, Router
from kafscale.protocol import (
    ErrorCode,
    FrameBuffer,
    decode_response,
    encode_request,
    make,
    nested,
    request_class,
    response_class,
)
from tests.integration.conftest import wait_until

T = TypeVar("T")

HEARTBEAT = 12  # the "control" API of these tests: its group_id says what the handler does
METADATA = 3

# ------------------------------------------------------------------------------- the server


def _metadata_handler() -> Any:
    async def handle(ctx: RequestContext, request: Any) -> Any:
        cls = response_class(ctx.api_key, ctx.api_version)
        broker = make(
            nested(cls, "MetadataResponseBroker"),
            node_id=0,
            host=ctx.listener.advertised_host,
            port=ctx.listener.port,
            rack=None,
        )
        return make(
            cls,
            throttle_time=0,
            brokers=(broker,),
            cluster_id="kafscale-test",
            controller_id=0,
            topics=(),
            cluster_authorized_operations=-2147483648,
        )

    return handle


class Control:
    """Heartbeat handler driven by group_id: 'sleep:<s>', 'none', 'raise', 'wrong', anything else
    answers at once. Records the highest number of handlers running at the same time."""

    def __init__(self) -> None:
        self.running = 0
        self.max_running = 0

    async def __call__(self, ctx: RequestContext, request: Any) -> Any:
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            command = request.group_id
            if command.startswith("sleep:"):
                await asyncio.sleep(float(command.split(":", 1)[1]))
            elif command == "none":
                return None
            elif command == "raise":
                raise RuntimeError("handler blew up (on purpose)")
            elif command == "wrong":
                return _metadata_response_v1()
            return make(response_class(ctx.api_key, ctx.api_version), error_code=ErrorCode.none, throttle_time=0)
        finally:
            self.running -= 1


def _metadata_response_v1() -> Any:
    return make(response_class(3, 1), brokers=(), controller_id=0, topics=())


class Server:
    """A Listener on a private event loop thread."""

    def __init__(self, **listener_kwargs: Any) -> None:
        self.control = Control()
        self.router = Router()
        self.router.register(METADATA, 0, 12, _metadata_handler())
        self.router.register(HEARTBEAT, 0, 4, self.control)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="listener-loop", daemon=True)
        self.thread.start()
        self.listener = Listener(self.router, "127.0.0.1", 0, **listener_kwargs)
        self.call(self.listener.start())
        self.port = self.listener.port
        self.address = f"127.0.0.1:{self.port}"

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def connections(self) -> int:
        async def count() -> int:
            return self.listener.connections

        return self.call(count())

    def stop(self, grace: float = 5.0) -> None:
        if self.loop.is_closed():
            return
        self.call(self.listener.stop(grace))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = Server()
    yield srv
    srv.stop()


# ------------------------------------------------------------------------------- a raw client


class RawClient:
    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.frames = FrameBuffer()
        self.ready: list[bytes] = []

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_frame(self) -> bytes:
        while not self.ready:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("closed by the server")
            self.ready += self.frames.feed(data)
        return self.ready.pop(0)

    def closed_by_server(self, timeout: float = 5.0) -> bool:
        """True when the server closes the connection within `timeout` (responses that arrive
        first are discarded)."""
        self.sock.settimeout(timeout)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if not self.sock.recv(65536):
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False
        return False

    def close(self) -> None:
        self.sock.close()


def api_versions_request(version: int = 3, corr: int = 1) -> bytes:
    cls = request_class(18, version)
    body = cls(client_software_name="raw", client_software_version="1.0") if version >= 3 else cls()
    return encode_request(body, corr, "raw-client")


def metadata_request(version: int, corr: int) -> bytes:
    return encode_request(
        make(
            request_class(METADATA, version),
            topics=None if version >= 1 else (),
            allow_auto_topic_creation=False,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        ),
        corr,
        "raw-client",
    )


def heartbeat_request(command: str, corr: int, version: int = 4) -> bytes:
    return encode_request(
        make(request_class(HEARTBEAT, version), group_id=command, generation_id=1, member_id="m",
             group_instance_id=None),
        corr,
        "raw-client",
    )


def check_api_versions(client: RawClient, corr: int) -> None:
    client.send(api_versions_request(3, corr))
    got_corr, resp = decode_response(18, 3, client.recv_frame())
    assert got_corr == corr and resp.error_code == ErrorCode.none
    assert {(k.api_key, k.min_version, k.max_version) for k in resp.api_keys} == {
        (3, 0, 12), (12, 0, 4), (18, 0, 4),
    }


@pytest.fixture(scope="module")
def observer(server: Server) -> Iterator[RawClient]:
    """A well-behaved client connected for the whole module; checked after each abuse."""
    client = RawClient(server.port)
    check_api_versions(client, 1)
    yield client
    check_api_versions(client, 2)
    client.close()


_observer_corr = iter(range(1000, 10**9))


def observer_still_fine(observer: RawClient) -> None:
    check_api_versions(observer, next(_observer_corr))


# ------------------------------------------------------------------------------- real clients


def test_confluent_kafka_list_topics(server: Server):
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": server.address, "socket.timeout.ms": 10000})
    md = admin.list_topics(timeout=10)
    assert md.cluster_id == "kafscale-test"
    assert [(b.id, b.host, b.port) for b in md.brokers.values()] == [(0, "127.0.0.1", server.port)]
    assert md.topics == {}


def test_kcat_metadata_listing(server: Server):
    proc = subprocess.run(
        ["kcat", "-b", server.address, "-L", "-m", "10"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "1 brokers:" in proc.stdout and f"127.0.0.1:{server.port}" in proc.stdout
    assert "0 topics:" in proc.stdout


def test_kafka_python_admin_negotiates(server: Server):
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=server.address, request_timeout_ms=10000)
    try:
        assert admin.list_topics() == []
        cluster = admin.describe_cluster()
        assert cluster["cluster_id"] == "kafscale-test"
    finally:
        admin.close()


async def test_aiokafka_bootstraps(server: Server):
    from aiokafka.client import AIOKafkaClient

    client = AIOKafkaClient(bootstrap_servers=server.address)
    await client.bootstrap()
    try:
        assert [b.nodeId for b in client.cluster.brokers()] == [0]
    finally:
        await client.close()


# ------------------------------------------------------------------------------- pipelining


def test_pipelined_responses_come_back_in_request_order(server: Server, observer: RawClient):
    client = RawClient(server.port)
    start = time.monotonic()
    client.send(
        heartbeat_request("sleep:0.4", 1)
        + api_versions_request(3, 2)
        + metadata_request(12, 3)
        + heartbeat_request("none", 4)  # acks=0-like: no response, must not hold up #5
        + heartbeat_request("sleep:0.4", 5)
        + metadata_request(1, 6)
    )
    corrs = []
    for api_key, version in [(HEARTBEAT, 4), (18, 3), (METADATA, 12), (HEARTBEAT, 4), (METADATA, 1)]:
        corr, resp = decode_response(api_key, version, client.recv_frame())
        corrs.append(corr)
        assert resp.__version__ == version
    elapsed = time.monotonic() - start
    assert corrs == [1, 2, 3, 5, 6]
    # both sleeps ran concurrently: well under their 0.8 s sum
    assert elapsed < 0.75, elapsed
    client.close()
    observer_still_fine(observer)


def test_in_flight_limit_pauses_reading():
    srv = Server(max_in_flight=3)
    try:
        client = RawClient(srv.port)
        client.send(b"".join(heartbeat_request("sleep:0.05", i) for i in range(20)))
        corrs = [decode_response(HEARTBEAT, 4, client.recv_frame())[0] for _ in range(20)]
        assert corrs == list(range(20))
        assert srv.control.max_running <= 3
        client.close()
    finally:
        srv.stop()


def test_in_flight_bytes_limit_pauses_reading():
    """Once its unanswered requests reach max_in_flight_bytes the connection takes no more frames, however
    many the count limit would allow; a request larger than the budget is taken when nothing else is."""
    srv = Server(max_in_flight=1000, max_in_flight_bytes=250_000)
    try:
        client = RawClient(srv.port)
        frames = []
        for i in range(12):
            req = heartbeat_request("sleep:0.05", i)
            body = req[4:] + bytes(100_000 if i else 400_000)  # trailing bytes are ignored, as by Kafka
            frames.append(struct.pack(">i", len(body)) + body)
        client.send(b"".join(frames))
        assert [decode_response(HEARTBEAT, 4, client.recv_frame())[0] for _ in range(12)] == list(range(12))
        # 100 kB frames: a third is still taken while 200 kB are held (under the 250 kB budget), a fourth
        # not while 300 kB are. (Exactly 3 unless the frames trickle in slower than the handlers finish.)
        assert 2 <= srv.control.max_running <= 3
        client.close()
    finally:
        srv.stop()


def test_idle_connections_are_closed_busy_ones_are_not():
    """Kafka's connections.max.idle.ms: silence closes a connection; a request in flight (a long
    poll) keeps it open however long it takes."""
    srv = Server(idle_timeout_s=0.4)
    try:
        idle = RawClient(srv.port)
        busy = RawClient(srv.port)
        busy.send(heartbeat_request("sleep:1.5", 1))
        time.sleep(1.0)
        assert idle.sock.recv(1) == b"", "the idle connection is still open"
        got_corr, _ = decode_response(HEARTBEAT, 4, busy.recv_frame())
        assert got_corr == 1
        busy.send(heartbeat_request("fast", 2))
        assert decode_response(HEARTBEAT, 4, busy.recv_frame())[0] == 2
        busy.close()
    finally:
        srv.stop()


def test_large_and_small_frames_interleaved_under_back_pressure():
    """Frames above the assembler's direct-read threshold (64 KiB) share one reused buffer;
    with a small in-flight limit they wait in it while earlier handlers run."""
    srv = Server(max_in_flight=2)
    try:
        client = RawClient(srv.port)
        frames = []
        for i in range(12):
            req = heartbeat_request("sleep:0.01" if i % 3 else "ok", i)
            if i % 2:  # pad to a large frame: Kafka (and we) ignore trailing bytes
                body = req[4:] + bytes([i]) * (100_000 + 50_000 * i)
                req = struct.pack(">i", len(body)) + body
            frames.append(req)
        client.send(b"".join(frames))
        assert [decode_response(HEARTBEAT, 4, client.recv_frame())[0] for _ in range(12)] == list(range(12))
        assert srv.control.max_running <= 2
        client.close()
    finally:
        srv.stop()


# ------------------------------------------------------------------------------- abuse


def test_unknown_api_key_closes_and_logs(server: Server, observer: RawClient, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.WARNING, logger="kafscale.acceptor")
    client = RawClient(server.port)
    payload = struct.pack(">hhih", 9999, 0, 7, 3) + b"bad" + b"\x00" * 8
    client.send(struct.pack(">i", len(payload)) + payload)
    assert client.closed_by_server()
    assert any("unknown API key 9999" in r.getMessage() and "'bad'" in r.getMessage() for r in caplog.records)
    observer_still_fine(observer)


@pytest.mark.parametrize(
    ("name", "frame"),
    [
        ("not registered (Produce)", lambda: encode_request(make(request_class(0, 9), transactional_id=None,
                                                                  acks=1, timeout=1000, topic_data=()), 1)),
        ("Metadata v13 (newer than registered)", lambda: struct.pack(">ihhih", 10, 3, 13, 1, -1) + b"\x00\x00"),
        ("Heartbeat v5", lambda: struct.pack(">ihhih", 10, 12, 5, 1, -1) + b"\x00\x00"),
        ("negative version", lambda: struct.pack(">ihhih", 8, 3, -1, 1, -1)),
    ],
)
def test_unsupported_api_or_version_closes(server: Server, observer: RawClient, name: str, frame: Any):
    client = RawClient(server.port)
    client.send(frame())
    assert client.closed_by_server(), name
    observer_still_fine(observer)


def test_api_versions_too_new_gets_v0_unsupported_version_and_stays_open(server: Server):
    client = RawClient(server.port)
    # ApiVersions v9 with a flexible (v2) header and a body we could not know
    payload = struct.pack(">hhih", 18, 9, 55, 4) + b"next" + b"\x00" + b"\x05whatever-future"
    client.send(struct.pack(">i", len(payload)) + payload)
    data = client.recv_frame()
    assert data == struct.pack(">ihihhh", 55, 35, 1, 18, 0, 4)
    corr, resp = decode_response(18, 4, data)  # UNSUPPORTED_VERSION answers are read as v0
    assert (corr, resp.error_code) == (55, ErrorCode.unsupported_version)
    check_api_versions(client, 56)  # the client downgrades on the same connection
    client.close()


@pytest.mark.parametrize(
    "prefix",
    [struct.pack(">i", 2**31 - 1), struct.pack(">I", 2**31), struct.pack(">i", -1), struct.pack(">i", 100 * 2**20 + 1)],
    ids=["2GiB", "int-min", "minus-one", "max-plus-one"],
)
def test_bad_size_prefix_closes_without_waiting_for_the_body(server: Server, observer: RawClient, prefix: bytes):
    client = RawClient(server.port)
    client.send(prefix)  # and nothing else: a server that tried to read the body would wait
    assert client.closed_by_server(timeout=3)
    observer_still_fine(observer)


def test_max_frame_bytes_limit():
    limit = 1024 * 1024
    srv = Server(max_frame_bytes=limit)
    try:
        # exactly the limit: a Metadata request padded with trailing bytes (ignored, as Kafka does)
        req = metadata_request(1, 9)[4:]
        padded = req + b"\x00" * (limit - len(req))
        client = RawClient(srv.port)
        client.send(struct.pack(">i", limit) + padded)
        assert decode_response(METADATA, 1, client.recv_frame())[0] == 9
        # one byte more: refused from the prefix alone
        client.send(struct.pack(">i", limit + 1))
        assert client.closed_by_server(timeout=3)
        client.close()
    finally:
        srv.stop()


def _valid_header(api_key: int, version: int, corr: int) -> bytes:
    flexible = version >= {METADATA: 9, HEARTBEAT: 4, 18: 3}[api_key]
    return struct.pack(">hhih", api_key, version, corr, 1) + b"x" + (b"\x00" if flexible else b"")


@pytest.mark.parametrize(
    "payload",
    [
        _valid_header(METADATA, 12, 3),  # no body at all
        _valid_header(METADATA, 12, 3) + b"\x02\x00",  # one topic, cut inside it
        _valid_header(METADATA, 1, 3) + b"\x00\x00\x00\x05" + b"\x00\x01a",  # 5 topics, 1 present
        _valid_header(METADATA, 1, 3) + b"\x7f\xff\xff\xff",  # 2^31-1 topics (kio would abort)
        _valid_header(METADATA, 12, 3) + b"\xff\xff\xff\xff\x0f",  # 2^32-2 topics (kio would abort)
        _valid_header(HEARTBEAT, 4, 3) + b"\x05ab",  # group id shorter than its length
        _valid_header(HEARTBEAT, 0, 3) + b"\xff\xf0",  # negative string length
        _valid_header(18, 3, 3) + b"\x03\xff\xfe\x02a\x00",  # invalid UTF-8 in the software name
        b"\x00\x03",  # shorter than a header
    ],
)
def test_malformed_bodies_close(server: Server, observer: RawClient, payload: bytes):
    client = RawClient(server.port)
    client.send(struct.pack(">i", len(payload)) + payload)
    assert client.closed_by_server()
    observer_still_fine(observer)


def test_truncated_frame_then_eof(server: Server, observer: RawClient):
    client = RawClient(server.port)
    full = metadata_request(12, 4)
    client.send(full[: len(full) // 2])
    client.sock.shutdown(socket.SHUT_WR)
    assert client.closed_by_server()
    observer_still_fine(observer)


def test_handler_failure_closes_after_earlier_responses(server: Server, observer: RawClient):
    for command in ("raise", "wrong"):
        client = RawClient(server.port)
        client.send(heartbeat_request("ok", 1) + heartbeat_request(command, 2) + heartbeat_request("ok", 3))
        assert decode_response(HEARTBEAT, 4, client.recv_frame())[0] == 1
        with pytest.raises(ConnectionError):
            client.recv_frame()
        client.close()
    observer_still_fine(observer)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.binary(min_size=1, max_size=300))
def test_random_bytes(server: Server, observer: RawClient, data: bytes):
    client = RawClient(server.port)
    try:
        client.send(data)
        client.sock.shutdown(socket.SHUT_WR)
        assert client.closed_by_server()
    except (ConnectionResetError, BrokenPipeError):
        pass
    finally:
        client.close()
    observer_still_fine(observer)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.sampled_from([(METADATA, 1), (METADATA, 4), (METADATA, 12), (HEARTBEAT, 0), (HEARTBEAT, 4), (18, 3)]),
    st.binary(max_size=200),
)
def test_garbage_after_valid_header(server: Server, observer: RawClient, key_version: tuple[int, int],
                                    body: bytes):
    api_key, version = key_version
    payload = _valid_header(api_key, version, 77) + body
    client = RawClient(server.port)
    try:
        client.send(struct.pack(">i", len(payload)) + payload)
        client.sock.settimeout(5)
        try:
            corr, _ = decode_response(api_key, version, client.recv_frame())
            assert corr == 77  # the garbage happened to decode: a proper answer
        except ConnectionError:
            pass  # closed: what Kafka does for a body it cannot parse
    finally:
        client.close()
    observer_still_fine(observer)


# ------------------------------------------------------------------------------- stop()


def test_stop_answers_in_flight_then_closes():
    srv = Server()
    try:
        idle = RawClient(srv.port)
        busy = RawClient(srv.port)
        busy.send(heartbeat_request("sleep:0.3", 1))
        # Both connections taken, and the busy one's request in its handler (not just sent), before the stop.
        wait_until(lambda: srv.connections() == 2 and srv.control.max_running == 1, what="two connections, one busy")
        srv.call(srv.listener.stop(grace=5))
        assert decode_response(HEARTBEAT, 4, busy.recv_frame())[0] == 1  # finished, then closed
        assert busy.closed_by_server(timeout=2)
        assert idle.closed_by_server(timeout=2)
        assert srv.connections() == 0
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", srv.port), timeout=2)
    finally:
        srv.stop()


def test_stop_cancels_handlers_after_grace():
    srv = Server()
    try:
        busy = RawClient(srv.port)
        busy.send(heartbeat_request("sleep:60", 1))
        time.sleep(0.1)
        start = time.monotonic()
        srv.call(srv.listener.stop(grace=0.3))
        assert time.monotonic() - start < 3
        assert busy.closed_by_server(timeout=2)
        assert srv.connections() == 0
    finally:
        srv.stop()


# ------------------------------------------------------------------ handlers that answer by future


def _ctx(api_key: int) -> RequestContext:
    return RequestContext(api_key, 0, 1, "t", "127.0.0.1", 1, 1, None)  # type: ignore[arg-type]


async def test_a_handler_that_returns_a_future_gets_no_task_and_is_timed_when_it_completes() -> None:
    router = Router()
    timed: list[tuple[int, float]] = []
    router.observe = lambda key, seconds: timed.append((key, seconds))
    answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    router.register(3, 0, 12, lambda ctx, req: answer)
    started = router.start(_ctx(3), None)
    assert started is answer and not isinstance(started, asyncio.Task)
    await asyncio.sleep(0.01)
    assert timed == []
    answer.set_result("response")
    assert await started == "response"
    await asyncio.sleep(0)
    assert [key for key, _ in timed] == [3] and timed[0][1] >= 0.01


async def test_a_handler_that_raises_before_returning_a_future_fails_its_answer() -> None:
    """The listener then logs it and closes the connection, as for a coroutine handler that raises."""
    router = Router()

    def broken(ctx: RequestContext, req: Any) -> asyncio.Future[Any]:
        raise RuntimeError("bug")

    router.register(3, 0, 12, broken)
    with pytest.raises(RuntimeError, match="bug"):
        await router.start(_ctx(3), None)
