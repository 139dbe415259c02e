"""The ObjectStore interface: the narrow set of operations the broker needs from S3.

Calls are blocking; the broker runs them on a thread pool (see the storage actors), and the
Spark pipeline calls them directly from its tasks.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field


class ObjectStoreError(Exception):
    """The store could not be reached or answered with an error; the operation may be retried."""


class ObjectNotFoundError(ObjectStoreError):
    """The key does not exist."""

    def __init__(self, key: str) -> None:
        super().__init__(f"object not found: {key}")
        self.key = key


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    modified: float = field(default=0.0, compare=False)  # seconds since the epoch, by the store's clock


@dataclass(frozen=True, slots=True)
class Volume:
    """Where a prefix's objects are, as operators name it, and the size of what holds them (-1: unbounded or
    unknown, as S3)."""

    path: str
    total_bytes: int = -1
    usable_bytes: int = -1


class ObjectStore(abc.ABC):
    """Keys are '/'-separated strings relative to the store's root (bucket or directory)."""

    # True when put_all_if_absent costs less than a put_if_absent per object, so that callers hand the
    # objects over in one call (the local store shares one directory fsync); False: they go one by one,
    # concurrently (S3 requests).
    puts_together = False

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Create or replace the object atomically: readers see the old or the new bytes, never a mix."""

    @abc.abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create the object only if the key does not exist; return False (and write nothing) if it does.

        Atomic under concurrent writers: of several racing creates of one key exactly one returns True.
        """

    def put_all_if_absent(self, items: Sequence[tuple[str, bytes]]) -> list[bool]:
        """put_if_absent of each (key, data), independently: one result per item, in order."""
        return [self.put_if_absent(key, data) for key, data in items]

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """Whole object. Raises ObjectNotFoundError."""

    @abc.abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Bytes [start, start+length) of the object, shorter if the object ends first.

        Raises ObjectNotFoundError; a start at or past the end returns b"".
        """

    @abc.abstractmethod
    def head(self, key: str) -> ObjectInfo | None:
        """Size of the object, or None when it does not exist."""

    @abc.abstractmethod
    def list(self, prefix: str, start_after: str = "", page_size: int = 1000) -> Iterator[ObjectInfo]:
        """Every object whose key starts with prefix, in lexicographic key order, fetched page by page."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; deleting a missing key is not an error."""

    def delete_many(self, keys: list[str]) -> None:
        for key in keys:
            self.delete(key)

    def volume(self, prefix: str) -> Volume:
        """Where the objects under prefix are (DescribeLogDirs names it as a broker's log directory)."""
        return Volume(f"{self!r}/{prefix}")

    def warm_up(self) -> None:  # noqa: B027 - optional hook
        """Pay one-time costs (client set-up, probes) now rather than in the first request; never raises."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
