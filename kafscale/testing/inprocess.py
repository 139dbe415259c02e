"""A broker shard running on its own event loop in a background thread of the calling process.

Blocking Kafka clients (confluent-kafka, kafka-python, kcat) can then talk to it from the test's
thread over real TCP, without Ray's start-up cost. `kafscale serve` (Ray) is tested separately.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from kafscale.actors.shard_host import ShardHost
from kafscale.config import BrokerConfig
from kafscale.storage.metadata_store import MetadataStore
from kafscale.storage.object_store import ObjectStore

T = TypeVar("T")


class InProcessBroker:
    def __init__(self, config: BrokerConfig, *, meta: Callable[[], MetadataStore],
                 objects: Callable[[], ObjectStore]) -> None:
        # Free ports for the Kafka listener and (unless disabled) the metrics endpoint: tests run side by side.
        metrics = "127.0.0.1:0" if config.metrics_listen else ""
        self.config = dataclasses.replace(config, listen="127.0.0.1:0", metrics_listen=metrics)
        self._meta_factory = meta
        self._objects_factory = objects
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kafscale-broker", daemon=True)
        self.shard: ShardHost | None = None
        self.meta: MetadataStore | None = None

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return fut.result(timeout)

    def start(self) -> InProcessBroker:
        self._thread.start()

        async def boot() -> None:
            self.meta = self._meta_factory()
            self.shard = ShardHost(0, self.config, meta=self.meta, objects=self._objects_factory())
            await self.shard.start()

        self.run(boot())
        return self

    @property
    def bootstrap(self) -> str:
        assert self.shard is not None
        return f"127.0.0.1:{self.shard.listener.port}"

    def bootstrap_for(self, listener: str) -> str:
        """The address of the named listener (configs with `listeners` give each 127.0.0.1:0)."""
        assert self.shard is not None
        found = next(li for li in self.shard.listeners if li.name == listener)
        return f"127.0.0.1:{found.port}"

    def stop(self) -> None:
        async def shutdown() -> None:
            if self.shard is not None:
                await self.shard.stop()
            if self.meta is not None:
                await self.meta.close()

        try:
            self.run(shutdown())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()

    def __enter__(self) -> InProcessBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
