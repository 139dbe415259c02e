"""The embedded metadata store's SQLite side: schema, value encoding, key ranges, compares, and what one
committed batch changes in the store's in-memory mirror (`Effects`)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from kafscale.storage.metadata_store import KeyValue

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS kv (
    key BLOB PRIMARY KEY,
    value BLOB NOT NULL,
    create_revision INTEGER NOT NULL,
    mod_revision INTEGER NOT NULL,
    version INTEGER NOT NULL,
    lease INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kv_by_lease ON kv (lease) WHERE lease != 0;
-- expires_at is wall-clock time (time.time()): a deadline has to mean the same after a restart.
CREATE TABLE IF NOT EXISTS leases (id INTEGER PRIMARY KEY, ttl REAL NOT NULL, expires_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    revision INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    type INTEGER NOT NULL,
    key BLOB NOT NULL,
    value BLOB,
    PRIMARY KEY (revision, seq)
) WITHOUT ROWID;
"""
PUT, DELETE = 0, 1

# A committed change as kept for watchers: (type, key bytes, packed value or None).
RawEvent = tuple[int, bytes, bytes | None]


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


def prefix_end(prefix: bytes) -> bytes | None:
    """Smallest key greater than every key starting with prefix; None means no upper bound."""
    b = bytearray(prefix)
    while b:
        if b[-1] < 0xFF:
            b[-1] += 1
            return bytes(b)
        b.pop()
    return None


def range_where(start: bytes, end: bytes | None) -> tuple[str, tuple[bytes, ...]]:
    if end is None:
        return "key >= ?", (start,)
    return "key >= ? AND key < ?", (start, end)


def key_range(key: str, prefix: bool) -> tuple[bytes, bytes | None, bool]:
    """(start, end, single) for an op's key: one key, or every key under a prefix."""
    kb = key.encode()
    return (kb, prefix_end(kb), False) if prefix else (kb, kb, True)


COMPARE_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    ">": lambda a, b: a > b,
}
COMPARE_COLUMNS = {"version": 1, "create_revision": 2, "mod_revision": 3}


@dataclass
class Effects:
    """What one committed batch changes in the loop's in-memory mirror."""

    revisions: list[tuple[int, tuple[RawEvent, ...]]] = field(default_factory=list)
    lease_changes: list[tuple[int, float | None]] = field(default_factory=list)  # None = gone
    compact_revision: int | None = None

    def extend(self, other: Effects) -> None:
        self.revisions.extend(other.revisions)
        self.lease_changes.extend(other.lease_changes)
        if other.compact_revision is not None:
            self.compact_revision = other.compact_revision


def get_meta(conn: sqlite3.Connection, name: str) -> int:
    row = conn.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
    return int(row[0]) if row else 0


def set_meta(conn: sqlite3.Connection, name: str, value: int) -> None:
    conn.execute(
        "INSERT INTO meta (name, value) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = excluded.value",
        (name, value),
    )


def select(conn: sqlite3.Connection, key: str, prefix: bool) -> list[KeyValue]:
    start, end, single = key_range(key, prefix)
    cols = "SELECT key, value, create_revision, mod_revision, version, lease FROM kv"
    if single:
        rows = conn.execute(f"{cols} WHERE key = ?", (start,)).fetchall()
    else:
        where, params = range_where(start, end)
        rows = conn.execute(f"{cols} WHERE {where} ORDER BY key", params).fetchall()
    return [KeyValue(k.decode(), unpack(v), c, m, ver, lease) for k, v, c, m, ver, lease in rows]
