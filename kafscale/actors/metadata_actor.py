"""One MetadataStore hosted in a Ray actor, and the client other processes use to reach it.

The embedded store is a single SQLite file with one writer, so broker shards in separate Ray worker
processes cannot each open it: one MetadataStoreActor opens it and every shard talks to it through a
RemoteMetadataStore. (With etcd, shards normally connect to etcd themselves; the actor works for it too.)

Watches cross the process boundary as long polls: wait_events(prefix, after_revision, timeout) returns
the next events after a revision. The client always asks for "after the last revision I delivered", so
a remote watch neither misses nor repeats an event, whatever happens to a single call.

The other calls (flush commits above all) go over the actor's direct channel when the client is on the
same node (kafscale.actors.metadata_channel): a Ray call costs far more CPU than the store's own work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import Any

import ray
from ray.actor import ActorHandle
from ray.exceptions import ActorUnavailableError, RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from kafscale.actors.heap import tune_gc_for_serving
from kafscale.actors.metadata_channel import UNARY_CALLS, ChannelClient, ChannelServer, decode_result, encode_args
from kafscale.config import BrokerConfig
from kafscale.storage.backoff import Backoff
from kafscale.storage.metadata_store import (
    Compare,
    KeyValue,
    MetadataStore,
    MetadataStoreError,
    Op,
    StoreStatus,
    TxnResult,
    WatchEvent,
)
from kafscale.storage.metadata_stores import metadata_store_from_settings

_POLL_TIMEOUT = 10.0
_MAX_EVENTS = 1000
_UNAVAILABLE_BACKOFF_MAX = 2.0

log = logging.getLogger(__name__)


@ray.remote(num_cpus=0, max_concurrency=10_000)
class MetadataStoreActor:
    """Hosts the store built by metadata_store_from_settings(**settings); methods mirror MetadataStore.

    Async actor: every call runs on the actor's event loop, so the hosted store sees one loop and
    long polls cost a coroutine each, not a thread.
    """

    def __init__(
        self,
        *,
        data_dir: str | None = None,
        etcd_endpoints: str | list[str] | None = None,
        prefix: str = "/kafscale/",
    ) -> None:
        self._store = metadata_store_from_settings(data_dir=data_dir, etcd_endpoints=etcd_endpoints, prefix=prefix)
        self._channel: asyncio.Task[ChannelServer] | None = None
        self._closed = False
        tune_gc_for_serving()

    async def ready(self) -> bool:
        return True

    async def channel(self) -> tuple[str, str, bytes]:
        """(node id, address, token) of the direct channel for clients on this node; started on first use."""
        if self._closed:
            raise MetadataStoreError("store is closed")
        if self._channel is None:
            self._channel = asyncio.get_running_loop().create_task(self._start_channel())
        server = await asyncio.shield(self._channel)
        return ray.get_runtime_context().get_node_id(), server.address, server.token

    async def _start_channel(self) -> ChannelServer:
        server = ChannelServer(self._store)
        await server.start()
        return server

    async def get(self, key: str) -> KeyValue | None:
        return await self._store.get(key)

    async def range(self, prefix: str) -> list[KeyValue]:
        return await self._store.range(prefix)

    async def put(self, key: str, value: Any, lease: int = 0) -> int:
        return await self._store.put(key, value, lease)

    async def delete(self, key: str, prefix: bool = False) -> int:
        return await self._store.delete(key, prefix)

    async def txn(self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()) -> TxnResult:
        return await self._store.txn(compares, success, failure)

    async def revision(self) -> int:
        return await self._store.revision()

    async def lease_grant(self, ttl_seconds: float) -> int:
        return await self._store.lease_grant(ttl_seconds)

    async def lease_keepalive(self, lease_id: int) -> bool:
        return await self._store.lease_keepalive(lease_id)

    async def lease_revoke(self, lease_id: int) -> None:
        await self._store.lease_revoke(lease_id)

    async def compact(self, revision: int) -> None:
        await self._store.compact(revision)

    async def status(self) -> StoreStatus:
        return await self._store.status()

    async def wait_events(
        self, prefix: str, after_revision: int, timeout: float = _POLL_TIMEOUT, max_events: int = _MAX_EVENTS
    ) -> list[WatchEvent]:
        """Events under prefix with revision > after_revision; waits up to timeout for the first one.

        Returns whole revisions only (a transaction's events are never split between two calls), so the
        caller can resume after the last revision it got. Raises CompactedError like watch().
        """
        ready: deque[WatchEvent] = deque()
        arrived = asyncio.Event()

        async def pump() -> None:
            async for event in self._store.watch(prefix, after_revision + 1):
                ready.append(event)
                arrived.set()

        # The hosted watch hands over everything it has without suspending between events of one revision
        # (both stores do), so whenever the pump is parked, `ready` ends on a revision boundary.
        pumping = asyncio.create_task(pump())
        arrival = asyncio.create_task(arrived.wait())
        try:
            await asyncio.wait({pumping, arrival}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if not ready:
                if pumping.done():
                    pumping.result()  # CompactedError, closed store …
                return []
            batch = [ready.popleft() for _ in range(min(max_events, len(ready)))]
            while ready and ready[0].mod_revision == batch[-1].mod_revision:
                batch.append(ready.popleft())
            return batch
        finally:
            for task in (arrival, pumping):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def close(self) -> None:
        self._closed = True
        if self._channel is not None:
            with contextlib.suppress(Exception):  # a channel that failed to start has nothing to close
                (await asyncio.shield(self._channel)).close()
        await self._store.close()


def start_metadata_actor(name: str, config: BrokerConfig, namespace: str, env: dict[str, str],
                         node_id: str) -> ActorHandle:
    """The embedded store's actor, pinned to `node_id`: started, or the one running under `name`. The
    controller asks for it, and so does `kafscale serve` beside the controller: started only by the controller,
    its worker would begin importing after the controller's, a second and a half later."""
    return MetadataStoreActor.options(  # type: ignore[attr-defined,no-any-return]
        name=name, namespace=namespace, get_if_exists=True, lifetime="detached", max_restarts=-1, num_cpus=0,
        max_concurrency=10_000, runtime_env={"env_vars": env},
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote(data_dir=config.data_dir, etcd_endpoints=None, prefix=config.etcd_prefix)


def _rebuild(handle: ActorHandle, poll_timeout: float, direct: bool = True) -> RemoteMetadataStore:
    return RemoteMetadataStore(handle, poll_timeout=poll_timeout, direct=direct)


class RemoteMetadataStore(MetadataStore):
    """A MetadataStore whose every call runs in a MetadataStoreActor.

    Picklable (it carries only the actor handle), so it can be passed to other actors. close() ends this
    client's watches; the actor and its store stay up for the other clients. direct=False keeps every
    call on Ray (the channel is opened on the first call otherwise, if the actor is on this node).
    """

    def __init__(self, handle: ActorHandle, *, poll_timeout: float = _POLL_TIMEOUT, direct: bool = True) -> None:
        self._handle = handle
        self._poll_timeout = poll_timeout
        self._direct = direct
        self._channel: ChannelClient | None = None
        self._opening: asyncio.Task[ChannelClient | None] | None = None
        self._closed = False
        self._closing: asyncio.Event | None = None

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _rebuild, (self._handle, self._poll_timeout, self._direct)

    @property
    def handle(self) -> ActorHandle:
        return self._handle

    async def _call(self, method: str, *args: Any) -> Any:
        if self._closed:
            raise MetadataStoreError("store is closed")
        if self._direct and method in UNARY_CALLS:
            channel = self._channel
            if channel is None or not channel.open or channel.loop is not asyncio.get_running_loop():
                channel = await self._open_channel()
            if channel is not None:
                return decode_result(method, args, await channel.call(method, encode_args(method, args)))
        return await self._ray_call(method, *args)

    async def _open_channel(self) -> ChannelClient | None:
        """The channel to use (opened once per loop and again after it broke), or None: Ray calls."""
        loop = asyncio.get_running_loop()
        opening = self._opening
        if opening is None or opening.get_loop() is not loop or (opening.done() and not _still_good(opening)):
            opening = self._opening = loop.create_task(self._connect())
        return await asyncio.shield(opening)

    async def _connect(self) -> ChannelClient | None:
        node, address, token = await self._ray_call("channel")
        try:
            here = ray.get_runtime_context().get_node_id()
        except Exception:  # Ray not initialised in this process: the handle works, node ids cannot be told
            here = None
        if node != here:
            return None
        try:
            self._channel = await ChannelClient.connect(address, token)
        except OSError as e:
            log.info("the metadata actor's channel is unreachable (%s); using Ray calls", e)
            return None
        return self._channel

    async def _ray_call(self, method: str, *args: Any) -> Any:
        try:
            return await getattr(self._handle, method).remote(*args)
        except RayTaskError as e:
            # The actor raised: hand back its own exception (CompactedError, ValueError …), not Ray's wrapper.
            cause = e.cause
            if isinstance(cause, Exception) and not isinstance(cause, RayError):
                raise cause from None
            raise MetadataStoreError(f"metadata actor {method} failed: {e}") from e
        except RayError as e:
            raise MetadataStoreError(f"metadata actor unreachable ({method}): {e}") from e

    async def get(self, key: str) -> KeyValue | None:
        return await self._call("get", key)

    async def range(self, prefix: str) -> list[KeyValue]:
        return await self._call("range", prefix)

    async def put(self, key: str, value: Any, lease: int = 0) -> int:
        return await self._call("put", key, value, lease)

    async def delete(self, key: str, prefix: bool = False) -> int:
        return await self._call("delete", key, prefix)

    async def txn(self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()) -> TxnResult:
        return await self._call("txn", list(compares), list(success), list(failure))

    async def revision(self) -> int:
        return await self._call("revision")

    async def lease_grant(self, ttl_seconds: float) -> int:
        return await self._call("lease_grant", ttl_seconds)

    async def lease_keepalive(self, lease_id: int) -> bool:
        return await self._call("lease_keepalive", lease_id)

    async def lease_revoke(self, lease_id: int) -> None:
        await self._call("lease_revoke", lease_id)

    async def compact(self, revision: int) -> None:
        await self._call("compact", revision)

    async def status(self) -> StoreStatus:
        return await self._call("status")

    async def watch(self, prefix: str, start_revision: int = 0) -> AsyncIterator[WatchEvent]:
        after = start_revision - 1 if start_revision > 0 else await self.revision()
        backoff = Backoff(0.05, _UNAVAILABLE_BACKOFF_MAX)
        while not self._closed:
            try:
                events = await self._poll(prefix, after)
            except MetadataStoreError as e:
                # An actor being restarted by Ray comes back; keep the position and ask again.
                if not isinstance(e.__cause__, ActorUnavailableError):
                    raise
                await backoff.wait()
                continue
            backoff.reset()
            if events is None:
                return
            for event in events:
                yield event
            if events:
                after = events[-1].mod_revision

    async def _poll(self, prefix: str, after: int) -> list[WatchEvent] | None:
        """One long poll, abandoned (None) as soon as this client is closed."""
        if self._closing is None:
            self._closing = asyncio.Event()
        poll = asyncio.ensure_future(self._call("wait_events", prefix, after, self._poll_timeout))
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            await asyncio.wait({poll, closing}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closing.cancel()
            if not poll.done():
                poll.cancel()
        if not poll.done() or poll.cancelled():
            return None
        return poll.result()

    async def close(self) -> None:
        self._closed = True
        if self._closing is not None:
            self._closing.set()
        if self._channel is not None and self._channel.loop is asyncio.get_running_loop():
            self._channel.close()


def _still_good(opening: asyncio.Task[ChannelClient | None]) -> bool:
    """A finished opening whose outcome stands: Ray calls for good, or a channel still open."""
    if opening.cancelled() or opening.exception() is not None:
        return False
    channel = opening.result()
    return channel is None or channel.open
