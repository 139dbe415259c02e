"""Idempotent producers through the proxy: one upstream producer id per (client producer, virtual partition).

A client numbers its batches per partition it sees, so the virtual partitions sharing one physical partition
each bring their own sequence 0, 1, 2, ... Under the client's producer id the upstream would see those sequences
interleaved in one partition and refuse them as out of order. So the proxy gives each (client producer id and
epoch, virtual partition) a producer id of its own, taken from the upstream with InitProducerId, and rewrites the
batches' producer id and epoch: the upstream then checks each virtual partition's sequences on their own, and
drops a retried batch as a duplicate, as it would without the proxy.

The ids live in the proxy's memory. A proxy that restarts takes new ones, and a client's next batch (sequence n,
not 0) is refused with OUT_OF_ORDER_SEQUENCE_NUMBER or UNKNOWN_PRODUCER_ID, upon which clients take a new epoch
and go on; what a retry then resends can be stored twice, as after any loss of producer state.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable

MAX_PRODUCERS = 100_000  # (client producer, virtual partition) pairs remembered, least recently used dropped

Key = tuple[int, int, str, int]  # client producer id, its epoch, topic, virtual partition


class ProducerIds:
    def __init__(self, take: Callable[[], Awaitable[tuple[int, int]]], size: int = MAX_PRODUCERS) -> None:
        self._take = take  # an InitProducerId upstream: (producer id, epoch)
        self._ids: OrderedDict[Key, asyncio.Future[tuple[int, int]]] = OrderedDict()
        self.size = size

    async def upstream(self, producer_id: int, epoch: int, topic: str, lane: int) -> tuple[int, int]:
        """The upstream producer id and epoch for a client's producer on one virtual partition."""
        key = (producer_id, epoch, topic, lane)
        future = self._ids.get(key)
        if future is None:
            future = self._ids[key] = asyncio.ensure_future(self._take())
            if len(self._ids) > self.size:
                self._ids.popitem(last=False)
        else:
            self._ids.move_to_end(key)
        try:
            return await asyncio.shield(future)
        except Exception:
            if self._ids.get(key) is future:
                del self._ids[key]  # the next batch asks again
            raise
