"""The records a group coordinator keeps in the metadata store, as it last wrote them: a change of the group is
written as the records that differ, and deletes of those no longer wanted, not as the whole group again.

A consumer-protocol group is stored as one record per member (groups/consumer/stored.py), as Kafka appends one
record per member to its log. Rewriting the whole group for each member's heartbeat made every group transaction
carry 17-22 KB for 50 members and take 60-80 ms on a loaded machine; a heartbeat now writes its own member's record
(and the group's header when the epoch moves).

A write that fails leaves the store unknown for its keys: they are written again (or deleted again) with the next
change, whatever they hold in memory then. Puts and deletes are idempotent, so a failure that did commit (a
timeout) is repaired the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kafscale.storage.metadata_store import Delete, Op, Put


class StoredRecords:
    def __init__(self, stored: Mapping[str, Any] | None = None) -> None:
        """`stored`: the group's records as read from the store (key -> value)."""
        self._values: dict[str, Any] = dict(stored or {})
        self._unsure: set[str] = set()

    def changes(self, wanted: Mapping[str, Any]) -> tuple[list[Op], set[str]]:
        """The ops that make the store hold exactly `wanted`, and the keys they touch (for `failed`). They are
        taken as written from now on: the caller submits them in order after everything submitted before."""
        ops: list[Op] = []
        for key, value in wanted.items():
            if key in self._unsure or self._values.get(key, _ABSENT) != value:
                ops.append(Put(key, value))
        ops += [Delete(key) for key in sorted((self._values.keys() | self._unsure) - wanted.keys())]
        self._values = dict(wanted)
        self._unsure.clear()
        return ops, {op.key for op in ops}

    def failed(self, keys: Iterable[str]) -> None:
        """A write of these keys failed: the next change writes them again."""
        self._unsure.update(keys)


_ABSENT = object()
