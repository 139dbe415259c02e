"""A prefix of the metadata store mirrored in memory: read whole, then kept current by a watch.

For the small, rarely written, always read sets every shard needs at hand (credentials, ACLs): a request checks
them without a store call, and a change reaches every shard as fast as the store's watch delivers it. A watch
that breaks (the store restarted, history compacted) costs a full read, never a missed change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from kafscale.storage.metadata_store import MetadataStore

log = logging.getLogger(__name__)
RETRY_S = 0.5


class Mirror:
    def __init__(self, meta: MetadataStore, prefix: str, on_change: Callable[[], None] = lambda: None) -> None:
        self.meta = meta
        self.prefix = prefix
        self.on_change = on_change  # after every change (and every full read)
        self.values: dict[str, Any] = {}  # key (without the prefix) -> value
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        revision = await self._load()
        self._task = asyncio.get_running_loop().create_task(self._follow(revision))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _load(self) -> int:
        revision = await self.meta.revision()
        self.values = {kv.key[len(self.prefix):]: kv.value for kv in await self.meta.range(self.prefix)}
        self.on_change()
        return revision + 1

    async def _follow(self, revision: int) -> None:
        while True:
            try:
                async for event in self.meta.watch(self.prefix, start_revision=revision):
                    revision = event.mod_revision + 1
                    key = event.key[len(self.prefix):]
                    if event.type == "put":
                        self.values[key] = event.value
                    else:
                        self.values.pop(key, None)
                    self.on_change()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a gap: read everything again
                log.warning("watch of %s interrupted: %s; reading it again", self.prefix, e)
                await asyncio.sleep(RETRY_S)
                with contextlib.suppress(Exception):
                    revision = await self._load()
