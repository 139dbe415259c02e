"""A direct line to the metadata actor from processes on its node: the unary MetadataStore calls (get,
range, put, delete, txn, revision, leases) over a Unix socket, as msgpack.

Why: a Ray actor call costs ~0.7 ms of CPU on each side on this machine kind before its arguments are
looked at, and every flush commit is one such call; at 16 partitions that was about a tenth of the
broker's CPU. Over the socket a call costs tens of microseconds on each side. Watches stay Ray long polls
(one call per batch of events); a client on another node, or one that cannot connect, uses Ray calls.

The socket is in Linux's abstract namespace (no file to leave behind, no path-length limit), where any
process of the host can reach it: the first message of a connection must be the actor's random token,
which only travels through Ray. Messages are msgpack values back to back: a request is
[id, method, args], a reply [id, ok, result] where a failed call's result is [error kind, message].
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import secrets
import socket
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import msgpack

from kafscale.storage.metadata_store import (
    CompactedError,
    Compare,
    Delete,
    Get,
    KeyValue,
    MetadataStore,
    MetadataStoreError,
    Op,
    Put,
    TxnResult,
)

log = logging.getLogger(__name__)

_MAX_REQUEST_BYTES = 64 << 20  # far above any transaction a broker builds (MAX_TXN_OPS small values)
_PUT, _DELETE, _GET = 0, 1, 2


# ---------------------------------------------------------------------------------------------- codec


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def _unpacker(max_buffer_size: int = 0) -> msgpack.Unpacker:
    return msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max_buffer_size)


def _op_out(op: Op) -> list[Any]:
    if isinstance(op, Put):
        return [_PUT, op.key, op.value, op.lease]
    if isinstance(op, Delete):
        return [_DELETE, op.key, op.prefix]
    if isinstance(op, Get):
        return [_GET, op.key, op.prefix]
    raise ValueError(f"not a txn op: {op!r}")


def _op_in(v: list[Any]) -> Op:
    kind = v[0]
    if kind == _PUT:
        return Put(v[1], v[2], v[3])
    if kind == _DELETE:
        return Delete(v[1], v[2])
    if kind == _GET:
        return Get(v[1], v[2])
    raise ValueError(f"not a txn op: {v!r}")


def _kv_out(kv: KeyValue) -> list[Any]:
    return [kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease]


def _kv_in(v: list[Any]) -> KeyValue:
    return KeyValue(v[0], v[1], v[2], v[3], v[4], v[5])


def _txn_out(result: TxnResult) -> list[Any]:
    responses = [[_kv_out(kv) for kv in r] if isinstance(r, list) else r for r in result.responses]
    return [result.succeeded, result.revision, responses]


def _txn_in(v: list[Any], success: Sequence[Op], failure: Sequence[Op]) -> TxnResult:
    succeeded, revision, responses = v
    branch = success if succeeded else failure
    return TxnResult(succeeded, revision, [[_kv_in(kv) for kv in r] if isinstance(op, Get) else r
                                           for op, r in zip(branch, responses, strict=True)])


_ERRORS: dict[str, type[Exception]] = {
    "compacted": CompactedError, "metadata": MetadataStoreError, "value": ValueError, "type": TypeError,
}


def _error_out(e: Exception) -> list[str]:
    for kind, cls in _ERRORS.items():
        if isinstance(e, cls):
            return [kind, str(e)]
    return ["other", f"{type(e).__name__}: {e}"]


def _error_in(method: str, v: list[str]) -> Exception:
    cls = _ERRORS.get(v[0])
    return cls(v[1]) if cls is not None else MetadataStoreError(f"metadata actor {method} failed: {v[1]}")


# ---------------------------------------------------------------------------------------------- server


async def _get(store: MetadataStore, a: list[Any]) -> Any:
    kv = await store.get(a[0])
    return None if kv is None else _kv_out(kv)


async def _range(store: MetadataStore, a: list[Any]) -> Any:
    return [_kv_out(kv) for kv in await store.range(a[0])]


async def _txn(store: MetadataStore, a: list[Any]) -> Any:
    compares = [Compare(*c) for c in a[0]]
    return _txn_out(await store.txn(compares, [_op_in(o) for o in a[1]], [_op_in(o) for o in a[2]]))


# The calls the channel serves: (store, wire args) -> wire result. Everything else (watches) goes by Ray.
_HANDLERS: dict[str, Callable[[MetadataStore, list[Any]], Awaitable[Any]]] = {
    "get": _get, "range": _range, "txn": _txn,
    "put": lambda store, a: store.put(a[0], a[1], a[2]),
    "delete": lambda store, a: store.delete(a[0], a[1]),
    "revision": lambda store, a: store.revision(),
    "lease_grant": lambda store, a: store.lease_grant(a[0]),
    "lease_keepalive": lambda store, a: store.lease_keepalive(a[0]),
    "lease_revoke": lambda store, a: store.lease_revoke(a[0]),
}
UNARY_CALLS = frozenset(_HANDLERS)


class ChannelServer:
    """Serves one store on an abstract Unix socket; runs on the loop that owns the store."""

    def __init__(self, store: MetadataStore) -> None:
        self.address = f"\0kafscale-metadata-{uuid.uuid4().hex}"
        self.token = secrets.token_bytes(16)
        self.calls = 0  # requests answered, for tests
        self.store = store
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[_ServerProtocol] = set()

    async def start(self) -> None:
        # The socket is made here, not by the loop: uvloop's own Unix sockets do not take abstract names.
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.address)
        self._server = await asyncio.get_running_loop().create_unix_server(lambda: _ServerProtocol(self), sock=sock)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections):
            conn.abort()


class _ServerProtocol(asyncio.Protocol):
    def __init__(self, server: ChannelServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.unpacker = _unpacker(_MAX_REQUEST_BYTES)
        self.trusted = False
        self.tasks: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        self.server._connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._connections.discard(self)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        try:
            self.unpacker.feed(data)
            for message in self.unpacker:
                if not self.trusted:
                    if not (isinstance(message, bytes) and hmac.compare_digest(message, self.server.token)):
                        log.warning("metadata channel: a connection without the token was closed")
                        self.abort()
                        return
                    self.trusted = True
                    continue
                self._start(message)
        except Exception as e:  # malformed or oversized input: this connection ends, the actor goes on
            log.warning("metadata channel: closing a connection that sent bad data (%s)", e)
            self.abort()

    def _start(self, message: Any) -> None:
        request_id, method, args = message
        handler = _HANDLERS.get(method)
        if handler is None:
            self._reply(request_id, False, ["value", f"unknown metadata call {method!r}"])
            return
        task = asyncio.get_running_loop().create_task(self._answer(request_id, handler, args))
        self.tasks.add(task)  # a task nobody references may be collected before it ends
        task.add_done_callback(self.tasks.discard)

    async def _answer(self, request_id: int, handler: Callable[[MetadataStore, list[Any]], Awaitable[Any]],
                      args: list[Any]) -> None:
        try:
            result = await handler(self.server.store, args)
        except Exception as e:
            self._reply(request_id, False, _error_out(e))
        else:
            self._reply(request_id, True, result)

    def _reply(self, request_id: int, ok: bool, result: Any) -> None:
        self.server.calls += 1
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(_pack([request_id, ok, result]))


# ---------------------------------------------------------------------------------------------- client


class ChannelClient:
    """One connection to a ChannelServer, on the loop that opened it; calls are multiplexed by id."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._unpacker = _unpacker()
        self._pending: dict[int, tuple[str, asyncio.Future[Any]]] = {}
        self._ids = itertools.count(1)
        self.open = False

    @classmethod
    async def connect(cls, address: str, token: bytes) -> ChannelClient:
        client = cls()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            await client.loop.sock_connect(sock, address)
            await client.loop.create_unix_connection(lambda: _ClientProtocol(client), sock=sock)
        except BaseException:
            sock.close()
            raise
        assert client._transport is not None
        client._transport.write(_pack(token))
        return client

    async def call(self, method: str, args: list[Any]) -> Any:
        if not self.open or self._transport is None:
            raise MetadataStoreError(f"metadata actor unreachable ({method}): connection closed")
        request_id = next(self._ids)
        future: asyncio.Future[Any] = self.loop.create_future()
        self._pending[request_id] = (method, future)
        try:
            self._transport.write(_pack([request_id, method, args]))
            return await future
        finally:
            self._pending.pop(request_id, None)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _received(self, data: bytes) -> None:
        self._unpacker.feed(data)
        for request_id, ok, result in self._unpacker:
            entry = self._pending.pop(request_id, None)
            if entry is None or entry[1].done():
                continue  # its caller gave up
            method, future = entry
            if ok:
                future.set_result(result)
            else:
                future.set_exception(_error_in(method, result))

    def _lost(self, exc: Exception | None) -> None:
        self.open = False
        pending, self._pending = self._pending, {}
        for method, future in pending.values():
            if not future.done():
                future.set_exception(MetadataStoreError(
                    f"metadata actor unreachable ({method}): connection lost{f' ({exc})' if exc else ''}"))


class _ClientProtocol(asyncio.Protocol):
    def __init__(self, client: ChannelClient) -> None:
        self.client = client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.client._transport = cast(asyncio.Transport, transport)
        self.client.open = True

    def data_received(self, data: bytes) -> None:
        try:
            self.client._received(data)
        except Exception as e:  # the actor's replies are not what this client speaks: stop using them
            log.warning("metadata channel: bad reply (%s); closing", e)
            assert self.client._transport is not None
            self.client._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.client._lost(exc)


# The client side of each unary MetadataStore call: (method, args) -> wire args, and wire result -> value.
def encode_args(method: str, args: tuple[Any, ...]) -> list[Any]:
    if method == "txn":
        compares, success, failure = args
        return [[[c.key, c.target, c.op, c.operand] for c in compares],
                [_op_out(o) for o in success], [_op_out(o) for o in failure]]
    return list(args)


def decode_result(method: str, args: tuple[Any, ...], result: Any) -> Any:
    if method == "txn":
        return _txn_in(result, args[1], args[2])
    if method == "get":
        return None if result is None else _kv_in(result)
    if method == "range":
        return [_kv_in(kv) for kv in result]
    return result

