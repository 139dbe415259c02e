"""A byte-bounded LRU shared by the partition owners of one shard (segments and indexes)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any


class ByteLRU:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self.size = 0
        self.hits = 0
        self.misses = 0
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()

    def get(self, key: Hashable) -> Any | None:
        entry = self._items.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._items.move_to_end(key)
        self.hits += 1
        return entry[0]

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def put(self, key: Hashable, value: Any, nbytes: int) -> None:
        if nbytes > self.capacity:
            return  # would evict everything for one entry
        old = self._items.pop(key, None)
        if old is not None:
            self.size -= old[1]
        self._items[key] = (value, nbytes)
        self.size += nbytes
        while self.size > self.capacity:
            _, (_, n) = self._items.popitem(last=False)
            self.size -= n

    def discard(self, key: Hashable) -> None:
        old = self._items.pop(key, None)
        if old is not None:
            self.size -= old[1]

    def discard_where(self, predicate: Any) -> None:
        for key in [k for k in self._items if predicate(k)]:
            self.discard(key)
