"""Asyncio face of a blocking ObjectStore: a bounded thread pool, timing and health for every call.

Every call is also counted as the requests an S3 store makes for it, by the kind the S3 bill prices (PUT and LIST
in one tier, GET and HEAD in another, DELETE free): an upload of a segment and its index is two PUTs, a listing
one LIST per 1,000 keys, a batched delete one request per 1,000 keys. The local store is counted the same way, so
its figures say what the same work would cost on S3."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from kafscale.storage.health import HealthState, HealthTracker
from kafscale.storage.object_store import ObjectInfo, ObjectNotFoundError, ObjectStore, Volume

T = TypeVar("T")
_MIB = 1024 * 1024
_PAGE = 1000  # keys per S3 LIST page and per DeleteObjects request
Observer = Callable[[str, float, bool, str, int], None]  # (operation, seconds, ok, request kind, requests)


class AsyncObjectStore:
    def __init__(self, store: ObjectStore, *, max_workers: int = 16, health: HealthTracker | None = None,
                 observer: Observer | None = None) -> None:
        self.store = store
        self.health = health or HealthTracker()
        self.observer = observer  # of every call: metrics
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="objstore")

    async def _call(self, fn: Callable[..., T], *args: object, kind: str, requests: int = 1, nbytes: int = 0) -> T:
        """nbytes: the payload the call moves when known before it (uploads, ranged reads); kind and requests: what
        S3 would bill for it (a LIST counts its pages once they are known)."""
        loop = asyncio.get_running_loop()
        # Timed in the worker thread: the wait for a free thread is our own backlog (a burst of acks=1
        # data queues hundreds of uploads), not the store's latency, and must not close the health gate.
        span = [0.0, 0.0]

        def timed() -> T:
            span[0] = time.monotonic()
            try:
                return fn(*args)
            finally:
                span[1] = time.monotonic()

        try:
            result = await loop.run_in_executor(self._pool, timed)
        except ObjectNotFoundError:
            # A missing key is an answer, not a sign of a sick store.
            self._record(fn, span[1] - span[0], True, nbytes, kind, requests)
            raise
        except Exception:
            self._record(fn, span[1] - span[0], False, nbytes, kind, requests)
            raise
        if not nbytes and isinstance(result, bytes | bytearray):
            nbytes = len(result)
        if kind == "list" and isinstance(result, list):
            requests = max(1, math.ceil(len(result) / _PAGE))
        self._record(fn, span[1] - span[0], True, nbytes, kind, requests)
        return result

    def _record(self, fn: Callable[..., object], seconds: float, ok: bool, nbytes: int, kind: str,
                requests: int) -> None:
        # Health judges latency per MiB moved: a 4 MiB segment upload that takes 800 ms because we
        # are pushing the store hard is throughput, not sickness, and must not close the gate on
        # the very producers that caused it. Small calls (HEADs, probes, index reads) count as they are.
        self.health.record(seconds / max(1.0, nbytes / _MIB), ok)
        if self.observer is not None:
            self.observer(getattr(fn, "__name__", "call").strip("_<>"), seconds, ok, kind, requests)

    async def warm_up(self) -> None:
        """The store's one-time set-up, off the event loop and outside the health record."""
        await asyncio.get_running_loop().run_in_executor(self._pool, self.store.warm_up)

    def state(self) -> HealthState:
        return self.health.state()

    async def put(self, key: str, data: bytes) -> None:
        await self._call(self.store.put, key, data, kind="put", nbytes=len(data))

    async def put_if_absent(self, key: str, data: bytes) -> bool:
        return await self._call(self.store.put_if_absent, key, data, kind="put", nbytes=len(data))

    async def put_all_if_absent(self, items: list[tuple[str, bytes]]) -> list[bool]:
        if self.store.puts_together:
            return await self._call(self.store.put_all_if_absent, items, kind="put", requests=len(items),
                                    nbytes=sum(len(d) for _, d in items))
        return list(await asyncio.gather(*(self.put_if_absent(key, data) for key, data in items)))

    async def get(self, key: str) -> bytes:
        return await self._call(self.store.get, key, kind="get")

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        return await self._call(self.store.get_range, key, start, length, kind="get", nbytes=length)

    async def head(self, key: str) -> ObjectInfo | None:
        return await self._call(self.store.head, key, kind="head")

    def volume(self, prefix: str) -> Volume:
        return self.store.volume(prefix)  # no request: a name, or one statvfs of a local directory

    async def list(self, prefix: str) -> list[ObjectInfo]:
        def list_objects() -> list[ObjectInfo]:
            return list(self.store.list(prefix))

        return await self._call(list_objects, kind="list")

    async def delete(self, key: str) -> None:
        await self._call(self.store.delete, key, kind="delete")

    async def delete_many(self, keys: list[str]) -> None:
        await self._call(self.store.delete_many, keys, kind="delete", requests=max(1, math.ceil(len(keys) / _PAGE)))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.store.close()
