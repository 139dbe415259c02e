"""EtcdStore: the MetadataStore on a real etcd cluster, through etcd3aio (asyncio gRPC).

The KV and lease services of etcd3aio are used as they are. The watch is driven from the raw gRPC
stub instead of etcd3aio's WatchService because that one resumes after a reconnect from the header
revision of the last response it saw, and the "created" response carries the *current* revision
before any catch-up event: a stream lost at that moment would silently skip history. Here the resume
point is always the last revision actually delivered + 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any, TypeVar

import grpc
import grpc.aio
import msgpack
from etcd3aio import EtcdError, prefix_range_end

# The generated protobuf types: etcd3aio has no public name for them.
from etcd3aio._protobuf import Compare as PbCompare
from etcd3aio._protobuf import RequestOp, WatchCreateRequest, WatchRequest, WatchStub
from etcd3aio.connections import ConnectionManager
from etcd3aio.kv import KVService
from etcd3aio.lease import LeaseService
from etcd3aio.maintenance import MaintenanceService

from kafscale.storage.backoff import Backoff
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
    StoreStatus,
    TxnResult,
    WatchEvent,
)

T = TypeVar("T")
log = logging.getLogger(__name__)

_COMPARE_RESULT = {
    "==": PbCompare.EQUAL,
    "!=": PbCompare.NOT_EQUAL,
    "<": PbCompare.LESS,
    ">": PbCompare.GREATER,
}
_COMPARE_TARGET = {
    "value": PbCompare.VALUE,
    "version": PbCompare.VERSION,
    "create_revision": PbCompare.CREATE,
    "mod_revision": PbCompare.MOD,
}
_RANGE_PAGE = 1000  # keys per Range call: stays far below gRPC's 4 MiB default message limit
_WATCH_BACKOFF_MIN = 0.05
_WATCH_BACKOFF_MAX = 1.0
# gRPC waits up to 120 s between reconnect attempts by default; a restarted etcd should be found again
# within about a second.
_RECONNECT_OPTIONS: list[tuple[str, int]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


class EtcdStore(MetadataStore):
    """endpoints: "host:port" or a list of them (or a comma-separated string).

    prefix namespaces every key: the store sees "k" where etcd holds prefix + "k", so several
    deployments or tests can share one etcd.
    Mutations are sent once (never retried by the client): a retried CAS whose first attempt did commit
    would report failure for a write that happened. A lost connection raises MetadataStoreError and
    the caller decides, usually by re-reading. Reads are retried on UNAVAILABLE within `timeout`.
    """

    def __init__(self, endpoints: list[str] | str, *, prefix: str = "", timeout: float = 5.0) -> None:
        if isinstance(endpoints, str):
            endpoints = [e.strip() for e in endpoints.split(",") if e.strip()]
        if not endpoints:
            raise ValueError("no etcd endpoints given")
        self.endpoints = [e.removeprefix("http://") for e in endpoints]
        self.prefix = prefix
        self._ns = prefix.encode()
        self._timeout = timeout
        self._channel: grpc.aio.Channel | None = None
        self._kv: KVService | None = None
        self._lease: LeaseService | None = None
        self._watch_stub: WatchStub | None = None
        self._closed = False
        self._watch_calls: set[grpc.aio.StreamStreamCall] = set()

    # ------------------------------------------------------------------ plumbing

    def _connect(self) -> tuple[KVService, LeaseService]:
        # Lazily, inside a coroutine: a grpc.aio channel belongs to the event loop it was created on.
        if self._closed:
            raise MetadataStoreError("store is closed")
        if self._kv is None or self._lease is None:
            manager = ConnectionManager(self.endpoints)
            manager.grpc_options = [*manager.grpc_options, *_RECONNECT_OPTIONS]
            self._channel = manager.get_channel()
            self._kv = KVService(self._channel)
            self._lease = LeaseService(self._channel)
            self._watch_stub = WatchStub(self._channel)
        return self._kv, self._lease

    async def _call(self, what: str, awaitable: Awaitable[T]) -> T:
        try:
            return await awaitable
        except (EtcdError, grpc.aio.AioRpcError, TimeoutError, OSError) as e:
            raise MetadataStoreError(f"etcd {what} failed: {e}") from e

    def _key(self, key: str) -> bytes:
        return self._ns + key.encode()

    @staticmethod
    def _span(key: bytes) -> tuple[bytes, bytes]:
        """[start, end) of every key starting with key; etcd wants "\\0" for "from the first key"."""
        return (key or b"\x00"), prefix_range_end(key)

    def _kv_from(self, kv: Any) -> KeyValue:
        return KeyValue(
            key=kv.key[len(self._ns) :].decode(),
            value=_unpack(kv.value),
            create_revision=kv.create_revision,
            mod_revision=kv.mod_revision,
            version=kv.version,
            lease=kv.lease,
        )

    # ------------------------------------------------------------------ reads

    async def get(self, key: str) -> KeyValue | None:
        kv, _ = self._connect()
        resp = await self._call("get", kv.get(self._key(key), timeout=self._timeout))
        return self._kv_from(resp.kvs[0]) if resp.kvs else None

    async def range(self, prefix: str) -> list[KeyValue]:
        kv, _ = self._connect()
        start, end = self._span(self._key(prefix))
        out: list[KeyValue] = []
        revision = 0  # pages after the first read at the first page's revision: one consistent view
        while True:
            resp = await self._call(
                "range",
                kv.get(start, range_end=end, revision=revision, limit=_RANGE_PAGE, timeout=self._timeout),
            )
            out.extend(self._kv_from(item) for item in resp.kvs)
            if not resp.more or not resp.kvs:
                return out
            revision = resp.header.revision
            start = resp.kvs[-1].key + b"\x00"

    async def revision(self) -> int:
        kv, _ = self._connect()
        resp = await self._call("revision", kv.get(self._ns or b"\x00", count_only=True, timeout=self._timeout))
        return int(resp.header.revision)

    # ------------------------------------------------------------------ writes

    async def put(self, key: str, value: Any, lease: int = 0) -> int:
        kv, _ = self._connect()
        resp = await self._call(
            "put", kv.put(self._key(key), _pack(value), lease=lease, timeout=self._timeout, max_attempts=1)
        )
        return int(resp.header.revision)

    async def delete(self, key: str, prefix: bool = False) -> int:
        kv, _ = self._connect()
        k, end = self._span(self._key(key)) if prefix else (self._key(key), None)
        resp = await self._call("delete", kv.delete(k, range_end=end, timeout=self._timeout, max_attempts=1))
        return int(resp.deleted)

    def _compare(self, c: Compare) -> PbCompare:
        try:
            result, target = _COMPARE_RESULT[c.op], _COMPARE_TARGET[c.target]
        except KeyError:
            raise ValueError(f"unsupported compare {c.target!r} {c.op!r}") from None
        pb = PbCompare(result=result, target=target, key=self._key(c.key))
        if c.target == "value":
            pb.value = _pack(c.operand)
        else:
            setattr(pb, c.target, int(c.operand))
        return pb

    def _op(self, op: Op) -> RequestOp:
        if isinstance(op, Put):
            return KVService.txn_op_put(self._key(op.key), _pack(op.value), lease=op.lease)
        k, end = self._span(self._key(op.key)) if op.prefix else (self._key(op.key), None)
        if isinstance(op, Delete):
            return KVService.txn_op_delete(k, range_end=end)
        if isinstance(op, Get):
            return KVService.txn_op_get(k, range_end=end)
        raise ValueError(f"not a txn op: {op!r}")

    def _response(self, op: Op, resp: Any) -> Any:
        if isinstance(op, Get):
            return [self._kv_from(item) for item in resp.response_range.kvs]
        if isinstance(op, Delete):
            return int(resp.response_delete_range.deleted)
        return None

    async def txn(self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()) -> TxnResult:
        kv, _ = self._connect()
        resp = await self._call(
            "txn",
            kv.txn(
                [self._compare(c) for c in compares],
                [self._op(op) for op in success],
                [self._op(op) for op in failure],
                timeout=self._timeout,
                max_attempts=1,
            ),
        )
        branch = success if resp.succeeded else failure
        responses = [self._response(op, r) for op, r in zip(branch, resp.responses, strict=True)]
        return TxnResult(bool(resp.succeeded), int(resp.header.revision), responses)

    async def compact(self, revision: int) -> None:
        """Drop etcd's history before revision (cluster-wide: etcd has one history for all prefixes)."""
        kv, _ = self._connect()
        try:
            await self._call("compact", kv.compact(revision, physical=True, timeout=self._timeout, max_attempts=1))
        except MetadataStoreError as e:
            if "required revision has been compacted" not in str(e):
                raise  # someone (another controller, etcd's own auto-compaction) got there first: fine

    async def status(self) -> StoreStatus:
        self._connect()
        assert self._channel is not None
        answer = await self._call("status", MaintenanceService(self._channel).status(timeout=self._timeout,
                                                                                    max_attempts=1))
        return StoreStatus(int(answer.header.revision), int(answer.dbSize))

    # ------------------------------------------------------------------ leases

    async def lease_grant(self, ttl_seconds: float) -> int:
        if ttl_seconds <= 0:
            raise ValueError("ttl_seconds must be positive")
        _, lease = self._connect()
        # etcd counts whole seconds (and raises anything below its minimum, 1-2 s depending on raft timing).
        ttl = max(1, math.ceil(ttl_seconds))
        resp = await self._call("lease grant", lease.grant(ttl, timeout=self._timeout, max_attempts=1))
        return int(resp.ID)

    async def lease_keepalive(self, lease_id: int) -> bool:
        _, lease = self._connect()
        call = lease.keep_alive(lease_id)
        try:
            resp = await self._call("lease keepalive", asyncio.wait_for(call.read(), self._timeout))
        finally:
            call.cancel()
        if resp is grpc.aio.EOF:
            raise MetadataStoreError("etcd closed the keepalive stream without an answer")
        return resp.TTL > 0

    async def lease_revoke(self, lease_id: int) -> None:
        _, lease = self._connect()
        try:
            await lease.revoke(lease_id, timeout=self._timeout, max_attempts=1)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:  # already lapsed or revoked: nothing left to do
                return
            raise MetadataStoreError(f"etcd lease revoke failed: {e}") from e
        except (EtcdError, TimeoutError, OSError) as e:
            raise MetadataStoreError(f"etcd lease revoke failed: {e}") from e

    # ------------------------------------------------------------------ watch

    async def watch(self, prefix: str, start_revision: int = 0) -> AsyncIterator[WatchEvent]:
        self._connect()
        key, end = self._span(self._key(prefix))
        next_rev = start_revision  # 0 until the first "created" response tells us what "now" is
        backoff = Backoff(_WATCH_BACKOFF_MIN, _WATCH_BACKOFF_MAX)
        while not self._closed:
            assert self._watch_stub is not None
            call = self._watch_stub.Watch(_watch_requests(key, end, next_rev))
            self._watch_calls.add(call)
            try:
                async for resp in call:
                    if resp.compact_revision:
                        raise CompactedError(
                            f"revision {next_rev} is compacted (etcd keeps {resp.compact_revision} onward)"
                        )
                    if resp.canceled:
                        raise MetadataStoreError(f"etcd cancelled the watch: {resp.cancel_reason}")
                    if resp.created:
                        if next_rev == 0:
                            next_rev = resp.header.revision + 1
                        backoff.reset()
                        continue
                    # etcd never splits one revision across responses, so after a response every event
                    # up to its last revision has been handed over.
                    for ev in resp.events:
                        if ev.kv.mod_revision < next_rev:
                            continue  # defensive: never repeat what was delivered before a reconnect
                        deleted = ev.type == ev.DELETE
                        yield WatchEvent(
                            "delete" if deleted else "put",
                            ev.kv.key[len(self._ns) :].decode(),
                            None if deleted else _unpack(ev.kv.value),
                            ev.kv.mod_revision,
                        )
                    if resp.events:
                        next_rev = resp.events[-1].kv.mod_revision + 1
                return  # the server ended the stream cleanly: only happens when we cancel it
            except asyncio.CancelledError:
                if self._closed:
                    return
                raise
            except grpc.aio.AioRpcError as e:
                if self._closed:
                    return
                if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise MetadataStoreError(f"etcd watch failed: {e}") from e
                log.info("etcd watch on %r lost (%s); resuming from revision %d", prefix, e.code().name, next_rev)
            finally:
                self._watch_calls.discard(call)
                call.cancel()
            await backoff.wait()

    # ------------------------------------------------------------------ lifecycle

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for call in list(self._watch_calls):
            call.cancel()
        if self._channel is not None:
            with contextlib.suppress(Exception):
                await self._channel.close()
        self._kv = self._lease = None
        self._watch_stub = None
        self._channel = None


async def _watch_requests(key: bytes, end: bytes, start_revision: int) -> AsyncIterator[WatchRequest]:
    yield WatchRequest(create_request=WatchCreateRequest(key=key, range_end=end, start_revision=start_revision))
    await asyncio.Event().wait()  # keep the request side open: closing it ends the watch
