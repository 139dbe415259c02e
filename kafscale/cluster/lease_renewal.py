"""A shard's lease renewals on a thread of their own, with their own connection to the metadata store.

The lease says the shard's process is alive, not that its event loop is idle. At full load a shard's loop runs
long iterations (measured on 2 cores with three busy shards: timers fired up to 0.6 s late), and a renewal made
there needs several of them (an etcd keepalive opens a gRPC stream, writes, reads): 0.8-1.7 s per renewal, and
leases lapsed several times a minute, each lapse moving the shard's partitions away as if it had died. Here the
renewal's I/O and its bookkeeping run on an idle loop: kafscale.cluster.membership's `serving` compares the
clock with the deadline this thread keeps, so the shard's loop is on neither path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable

from kafscale.storage.metadata_store import MetadataStore

log = logging.getLogger(__name__)


class Renewer:
    """Renews the lease `lease()` names (0: none now) every `every_s`, then calls `answered(lease, sent, alive)`
    (sent: time.monotonic() when the renewal was sent). Runs on whichever loop awaits run(): a RenewalThread's,
    or the caller's own."""

    def __init__(self, store: Callable[[], MetadataStore], lease: Callable[[], int],
                 answered: Callable[[int, float, bool], None], every_s: float, timeout_s: float) -> None:
        self._store = store
        self._lease = lease
        self._answered = answered
        self._every_s = every_s
        self._timeout_s = timeout_s
        self.out_since: float | None = None  # when the renewal now out was sent (None: none is)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._every_s)
            current = self._lease()
            if not current:
                continue
            sent = self.out_since = time.monotonic()
            try:
                alive = await asyncio.wait_for(self._store().lease_keepalive(current), self._timeout_s)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the store is unreachable: the deadline runs out unless this passes
                log.warning("lease %x: renewal failed: %s", current, e)
                continue
            finally:
                self.out_since = None
            self._answered(current, sent, alive)


class RenewalThread:
    def __init__(self, open_store: Callable[[], MetadataStore], name: str = "lease-renewal") -> None:
        self._open = open_store
        self._store: MetadataStore | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._task: asyncio.Future[None] | None = None

    def start(self, lease: Callable[[], int], answered: Callable[[int, float, bool], None], every_s: float,
              timeout_s: float) -> Renewer:
        """Runs a Renewer on this thread, with a connection of its own (`answered` is called on this thread)."""
        renewer = Renewer(self._connection, lease, answered, every_s, timeout_s)
        self._thread.start()
        self._task = asyncio.run_coroutine_threadsafe(renewer.run(), self._loop)
        return renewer

    def _connection(self) -> MetadataStore:
        if self._store is None:  # opened on this thread's loop, where it is used
            self._store = self._open()
        return self._store

    def close(self) -> None:
        """Stop renewing and close the connection (blocks up to a few seconds: call it off the shard's loop)."""
        if not self._thread.is_alive():
            return

        async def shut() -> None:
            if self._task is not None:
                self._task.cancel()
            if self._store is not None:
                await self._store.close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self._loop.close()
