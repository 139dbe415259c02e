"""The embedded metadata store's transactions, as the single writer thread applies them: etcd's data model
(one store-wide revision per changing transaction, compares, puts, range deletes, leases) on SQLite.

Each function runs inside the writer's SQLite transaction and records in `fx` what the loop-side mirror of
kafscale.storage.embedded_store must learn once the batch is on disk.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from typing import Any

from kafscale.storage.embedded_sql import (
    COMPARE_COLUMNS,
    COMPARE_OPS,
    DELETE,
    PUT,
    Effects,
    RawEvent,
    get_meta,
    key_range,
    pack,
    range_where,
    select,
    set_meta,
)
from kafscale.storage.metadata_store import Compare, Delete, Get, MetadataStoreError, Op, Put, TxnResult


class Transactions:
    """The writer thread's state: its connection, the revision it hands out next, the compaction point."""

    def __init__(self, conn: sqlite3.Connection, history: int) -> None:
        self.conn = conn
        self.history = history  # revisions of events kept for watchers that resume
        self.revision = get_meta(conn, "revision")
        self.compact_revision = get_meta(conn, "compact_revision")

    def reload(self) -> None:
        """After a rolled-back group: forget the revisions it handed out."""
        self.revision = get_meta(self.conn, "revision")
        self.compact_revision = get_meta(self.conn, "compact_revision")

    def new_revision(self, fx: Effects, events: list[RawEvent]) -> int:
        revision = self.revision + 1
        self.conn.executemany(
            "INSERT INTO events (revision, seq, type, key, value) VALUES (?, ?, ?, ?, ?)",
            [(revision, seq, t, k, v) for seq, (t, k, v) in enumerate(events)],
        )
        set_meta(self.conn, "revision", revision)
        self.revision = revision
        fx.revisions.append((revision, tuple(events)))
        return revision

    def trim_history(self, fx: Effects) -> None:
        oldest_kept = self.revision - self.history + 1
        if oldest_kept > self.compact_revision:
            self.compact_to(fx, oldest_kept)

    def compact_to(self, fx: Effects, revision: int) -> None:
        self.conn.execute("DELETE FROM events WHERE revision < ?", (revision,))
        set_meta(self.conn, "compact_revision", revision)
        self.compact_revision = revision
        fx.compact_revision = revision

    def compact_request(self, fx: Effects, revision: int) -> None:
        if revision > self.revision:
            raise MetadataStoreError(f"cannot compact at {revision}: the store is at {self.revision}")
        if revision > self.compact_revision:
            self.compact_to(fx, revision)

    def compare(self, c: Compare) -> bool:
        op = COMPARE_OPS.get(c.op)
        if op is None:
            raise ValueError(f"unknown compare op {c.op!r}")
        row = self.conn.execute(
            "SELECT value, version, create_revision, mod_revision FROM kv WHERE key = ?", (c.key.encode(),)
        ).fetchone()
        if c.target == "value":
            # As in etcd: packed bytes are compared, and a value compare on a missing key is false.
            return row is not None and op(row[0], pack(c.operand))
        column = COMPARE_COLUMNS.get(c.target)
        if column is None:
            raise ValueError(f"unknown compare target {c.target!r}")
        return op(row[column] if row is not None else 0, int(c.operand))

    @staticmethod
    def check_overlaps(ops: Sequence[Op]) -> None:
        """etcd rejects a txn that puts a key twice or puts a key it also deletes; so does this store."""
        put_keys: set[bytes] = set()
        for op in ops:
            if isinstance(op, Put):
                kb = op.key.encode()
                if kb in put_keys:
                    raise MetadataStoreError(f"duplicate key given in txn request: {op.key!r}")
                put_keys.add(kb)
        for op in ops:
            if isinstance(op, Delete) and put_keys:
                start, end, single = key_range(op.key, op.prefix)
                if any(k == start if single else (k >= start and (end is None or k < end)) for k in put_keys):
                    raise MetadataStoreError(f"txn puts a key it also deletes ({op.key!r})")

    def txn(
        self, fx: Effects, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]
    ) -> TxnResult:
        succeeded = all(self.compare(c) for c in compares)
        ops = success if succeeded else failure
        self.check_overlaps(ops)
        conn = self.conn
        revision = self.revision + 1  # what this txn's writes carry, if it writes anything
        now = time.time()
        events: list[RawEvent] = []
        responses: list[Any] = []
        for op in ops:
            if isinstance(op, Get):
                responses.append(select(conn, op.key, op.prefix))
            elif isinstance(op, Put):
                if op.lease:
                    row = conn.execute("SELECT expires_at FROM leases WHERE id = ?", (op.lease,)).fetchone()
                    if row is None or row[0] <= now:
                        raise MetadataStoreError(f"requested lease not found: {op.lease}")
                kb, packed = op.key.encode(), pack(op.value)
                conn.execute(
                    "INSERT INTO kv (key, value, create_revision, mod_revision, version, lease)"
                    " VALUES (?, ?, ?, ?, 1, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value,"
                    " mod_revision = excluded.mod_revision, version = kv.version + 1, lease = excluded.lease",
                    (kb, packed, revision, revision, op.lease),
                )
                events.append((PUT, kb, packed))
                responses.append(None)
            elif isinstance(op, Delete):
                deleted = self.delete_range(*key_range(op.key, op.prefix))
                events.extend((DELETE, k, None) for k in deleted)
                responses.append(len(deleted))
            else:
                raise ValueError(f"not a txn op: {op!r}")
        if events:  # etcd bumps the revision only when something changed
            self.new_revision(fx, events)
        return TxnResult(succeeded, self.revision, responses)

    def delete_range(self, start: bytes, end: bytes | None, single: bool) -> list[bytes]:
        if single:
            rows = self.conn.execute("DELETE FROM kv WHERE key = ? RETURNING key", (start,)).fetchall()
        else:
            where, params = range_where(start, end)
            rows = self.conn.execute(f"DELETE FROM kv WHERE {where} RETURNING key", params).fetchall()
        return sorted(r[0] for r in rows)

    def revoke(self, fx: Effects, lease_id: int) -> None:
        rows = self.conn.execute("DELETE FROM kv WHERE lease = ? RETURNING key", (lease_id,)).fetchall()
        self.conn.execute("DELETE FROM leases WHERE id = ?", (lease_id,))
        if rows:
            self.new_revision(fx, [(DELETE, k, None) for k in sorted(r[0] for r in rows)])
        fx.lease_changes.append((lease_id, None))

    def renew_all_leases(self, fx: Effects) -> None:
        """Every lease runs its full TTL again from now, as etcd's does when a member becomes leader (and so
        after every restart): the store being down is not a sign that any lease holder is."""
        now = time.time()
        for lease_id, ttl in self.conn.execute("SELECT id, ttl FROM leases").fetchall():
            self.conn.execute("UPDATE leases SET expires_at = ? WHERE id = ?", (now + ttl, lease_id))
            fx.lease_changes.append((lease_id, now + ttl))

    def expire_leases(self, fx: Effects) -> int:
        due = self.conn.execute(
            "SELECT id FROM leases WHERE expires_at <= ? ORDER BY expires_at", (time.time(),)
        ).fetchall()
        for (lease_id,) in due:  # one revision per lease, as etcd revokes them one by one
            self.revoke(fx, lease_id)
        return len(due)

    def lease_grant(self, fx: Effects, ttl: float) -> int:
        lease_id = get_meta(self.conn, "last_lease_id") + 1
        set_meta(self.conn, "last_lease_id", lease_id)
        expires_at = time.time() + ttl
        self.conn.execute("INSERT INTO leases (id, ttl, expires_at) VALUES (?, ?, ?)", (lease_id, ttl, expires_at))
        fx.lease_changes.append((lease_id, expires_at))
        return lease_id

    def lease_keepalive(self, fx: Effects, lease_id: int) -> bool:
        row = self.conn.execute("SELECT ttl, expires_at FROM leases WHERE id = ?", (lease_id,)).fetchone()
        now = time.time()
        if row is None:
            return False
        if row[1] <= now:
            self.revoke(fx, lease_id)
            return False
        expires_at = now + row[0]
        self.conn.execute("UPDATE leases SET expires_at = ? WHERE id = ?", (expires_at, lease_id))
        fx.lease_changes.append((lease_id, expires_at))
        return True

    def lease_revoke(self, fx: Effects, lease_id: int) -> None:
        if self.conn.execute("SELECT 1 FROM leases WHERE id = ?", (lease_id,)).fetchone():
            self.revoke(fx, lease_id)
