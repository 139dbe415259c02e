"""The MetadataStore interface: etcd's data model (revisions, CAS transactions, leases, watches).

Keys are strings, values are any msgpack-serialisable Python value (the store packs them).
Every mutation gets a store-wide revision that increases by one per transaction, as in etcd.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

# etcd refuses transactions of more than 128 operations, compares included (--max-txn-ops). Writers that may
# build larger ones split them at this size, which leaves room for their fencing compares.
MAX_TXN_OPS = 120


class MetadataStoreError(Exception):
    """The store could not be reached or failed; the operation may be retried."""


class CompactedError(MetadataStoreError):
    """A watch asked to resume from a revision the store no longer keeps."""


@dataclass(frozen=True, slots=True)
class StoreStatus:
    revision: int
    db_bytes: int  # the database on disk: etcd's dbSize (of the member that answered), or the SQLite files


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: Any
    create_revision: int
    mod_revision: int
    version: int  # number of puts since the key was (re)created; 0 means absent in compares
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Compare:
    """One guard of a transaction, evaluated like etcd's Compare on a single key.

    target: "value" compares the unpacked value; "version", "create_revision", "mod_revision"
    compare integers (0 when the key does not exist, so `Compare(k, "version", "==", 0)` means absent).
    """

    key: str
    target: Literal["value", "version", "create_revision", "mod_revision"]
    op: Literal["==", "!=", "<", ">"]
    operand: Any


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: Any
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Delete:
    key: str
    prefix: bool = False  # delete every key starting with `key`


@dataclass(frozen=True, slots=True)
class Get:
    key: str
    prefix: bool = False


Op = Put | Delete | Get


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int
    # One entry per op of the branch taken: list[KeyValue] for Get, None for Put, count for Delete.
    responses: list[Any] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: Literal["put", "delete"]
    key: str
    value: Any  # None for deletes
    mod_revision: int


class MetadataStore(abc.ABC):
    @abc.abstractmethod
    async def get(self, key: str) -> KeyValue | None: ...

    @abc.abstractmethod
    async def range(self, prefix: str) -> list[KeyValue]:
        """Every key starting with prefix, in key order."""

    @abc.abstractmethod
    async def put(self, key: str, value: Any, lease: int = 0) -> int:
        """Returns the revision of the write."""

    @abc.abstractmethod
    async def delete(self, key: str, prefix: bool = False) -> int:
        """Returns the number of keys deleted."""

    @abc.abstractmethod
    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        """All compares true → apply success ops, else failure ops; atomically, one revision."""

    @abc.abstractmethod
    async def revision(self) -> int:
        """The store's current revision."""

    @abc.abstractmethod
    async def lease_grant(self, ttl_seconds: float) -> int:
        """A new lease; keys attached to it vanish when it lapses or is revoked."""

    @abc.abstractmethod
    async def lease_keepalive(self, lease_id: int) -> bool:
        """Refresh the lease's TTL; False if it has already lapsed."""

    @abc.abstractmethod
    async def lease_revoke(self, lease_id: int) -> None: ...

    @abc.abstractmethod
    def watch(self, prefix: str, start_revision: int = 0) -> AsyncIterator[WatchEvent]:
        """Events for keys under prefix, in revision order, from start_revision (0 = from now).

        The iterator survives a lost connection: it reconnects and resumes after the last revision it
        delivered, so no event is lost or repeated. Raises CompactedError if that history is gone.
        Stops when the consumer stops iterating (aclose) or the store is closed.
        """

    async def compact(self, revision: int) -> None:
        """Drop the history before revision: watches from earlier revisions get CompactedError. Compacting
        to a revision already compacted is not an error."""
        raise MetadataStoreError(f"{type(self).__name__} cannot compact")

    async def status(self) -> StoreStatus:
        return StoreStatus(await self.revision(), 0)

    async def compare_and_swap(self, key: str, expected_mod_revision: int, value: Any) -> bool:
        """Write value only if the key is unchanged since expected_mod_revision (0 = must not exist)."""
        result = await self.txn([Compare(key, "mod_revision", "==", expected_mod_revision)], [Put(key, value)])
        return result.succeeded

    @abc.abstractmethod
    async def close(self) -> None: ...
