"""The cleaner's key map: each key's latest offset in the dirty part of a log, in bounded memory.

Kafka's cleaner keeps the same map in `log.cleaner.dedupe.buffer.size` bytes (16-byte MD5 of each key and an
8-byte offset). Here the bound is a number of entries (`kafscale serve --compaction-map-entries`); a key longer
than a digest is held as its 16-byte BLAKE2b digest, a shorter one as itself. A partition whose dirty part has more
distinct keys than fit is cleaned in passes: each pass maps what fits and cleans up to there.
"""

from __future__ import annotations

from hashlib import blake2b

_DIGEST = 16
# What one entry costs in CPython (a dict slot, the key bytes object, the int): for the memory bound's arithmetic.
ENTRY_BYTES = 120


def _slot(key: bytes) -> bytes:
    return key if len(key) <= _DIGEST else blake2b(key, digest_size=_DIGEST).digest()


class KeyMap:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a key map needs room for at least one key, not {capacity}")
        self.capacity = capacity
        self._latest: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._latest)

    def room_for(self, keys: list[bytes]) -> bool:
        """Whether every one of these keys fits (those already mapped need no room)."""
        free = self.capacity - len(self._latest)
        return len(keys) <= free or sum(_slot(k) not in self._latest for k in keys) <= free

    def put_all(self, pairs: list[tuple[bytes, int]]) -> None:
        latest = self._latest
        for key, offset in pairs:  # inlined _slot: this runs once per record of the dirty log
            latest[key if len(key) <= _DIGEST else blake2b(key, digest_size=_DIGEST).digest()] = offset

    def lookup(self, key: bytes) -> int | None:
        """The key's latest offset, or None; asked of every record of the log."""
        return self._latest.get(_slot(key))
