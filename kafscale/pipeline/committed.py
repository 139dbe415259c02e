"""What the metadata store says is durably committed: topics, and per partition its offsets and segments.

Only committed segments are read. An object in the bucket without a segment record is an upload whose
commit never happened (a crash, a fenced owner) and may be replaced; the partition state's next_offset
is the high watermark, so a segment record at or past it is ignored as well.

Transactions: each partition's producer records say where every still-open transaction starts
(``txn_first``); the last stable offset (LSO), below which every transaction is decided, is the smallest of
those and the high watermark. Each segment record lists the transactions its abort markers aborted; the
partition's aborted transactions are those of its kept segments. A partition's state, producers and
segments are read in one consistent read (one SQLite read transaction; one etcd range per topic, which
reads every page at the revision of its first), since the broker commits them together.

The embedded store (a broker's --data-dir) is read straight from its SQLite file, read-only, so that a
pipeline can run next to a live broker, which holds the store's writer lock. etcd is read with the
broker's own client.
"""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from kafscale.cluster import keys
from kafscale.cluster.records import AbortedTxn, SegmentMeta
from kafscale.pipeline.location import Location
from kafscale.storage.metadata_store import MetadataStore
from kafscale.storage.metadata_stores import metadata_store_from_settings

__all__ = ["PartitionLog", "Snapshot", "TopicMeta", "last_stable_offset", "read_snapshot", "select_topics",
           "topic_names"]


@dataclass(frozen=True, slots=True)
class TopicMeta:
    name: str
    partitions: int
    configs: dict[str, Any] = field(default_factory=dict)

    @property
    def log_append_time(self) -> bool:
        return str(self.configs.get("message.timestamp.type", "")).lower() == "logappendtime"


@dataclass(frozen=True, slots=True)
class PartitionLog:
    topic: str
    partition: int
    log_start: int  # first offset still kept
    end: int  # high watermark: one past the last committed offset
    segments: tuple[SegmentMeta, ...]  # committed, in offset order, overlapping [log_start, end)
    # last stable offset: the first offset of the earliest still-open transaction, else the high watermark;
    # read_committed readers read only below it
    stable: int = -1
    # the transactions aborted in the kept segments (a producer's transactional batches in [first, last])
    aborted: tuple[AbortedTxn, ...] = ()

    def visible_end(self, read_committed: bool) -> int:
        """Where a reader of this isolation level stops: the LSO under read_committed, else the high watermark."""
        return (self.end if self.stable < 0 else self.stable) if read_committed else self.end


@dataclass(frozen=True, slots=True)
class Snapshot:
    topics: dict[str, TopicMeta]
    logs: dict[tuple[str, int], PartitionLog]

    def partitions(self) -> list[tuple[str, int]]:
        return sorted(self.logs)


def select_topics(names: Iterable[str], *, topics: list[str] | None = None, pattern: str | None = None) -> list[str]:
    """Kafka source semantics: explicit topics must exist; a pattern matches whole names."""
    names = sorted(names)
    if pattern is not None:
        regex = re.compile(pattern)
        return [n for n in names if regex.fullmatch(n)]
    wanted = topics or []
    missing = [t for t in wanted if t not in names]
    if missing:
        raise ValueError(f"unknown topic(s): {', '.join(missing)}")
    return wanted


def read_snapshot(location: Location, *, topics: list[str] | None = None, pattern: str | None = None) -> Snapshot:
    """Committed state of the selected topics (all topics when neither is given)."""
    if location.etcd_endpoints:
        return asyncio.run(_etcd_snapshot(location, topics, pattern))
    return _sqlite_snapshot(location.metadata_path(), topics, pattern)


def topic_names(location: Location) -> list[str]:
    """Every topic, without reading any partition state."""
    if location.etcd_endpoints:
        return asyncio.run(_etcd_topic_names(location))
    conn = _sqlite_connect(location.metadata_path())
    try:
        return sorted(_sqlite_topics(conn))
    finally:
        conn.close()


def _build(topic_values: dict[str, Any], selected: list[str], states: dict[tuple[str, int], Any],
           segments: dict[tuple[str, int], list[Any]], producers: dict[tuple[str, int], list[Any]]) -> Snapshot:
    metas = {name: TopicMeta(name, int(topic_values[name]["partitions"]), dict(topic_values[name].get("configs", {})))
             for name in selected}
    logs: dict[tuple[str, int], PartitionLog] = {}
    for name, meta in metas.items():
        for p in range(meta.partitions):
            state = states.get((name, p)) or {}
            end = int(state.get("next_offset", 0))
            start = int(state.get("log_start_offset", 0))
            segs = sorted((SegmentMeta.from_value(v) for v in segments.get((name, p), [])), key=lambda s: s.base)
            kept = tuple(s for s in segs if s.base < end and s.last >= start)
            logs[(name, p)] = PartitionLog(name, p, start, end, kept, last_stable_offset(start, end, producers.get(
                (name, p), [])), tuple(a for s in kept for a in s.aborted))
    return Snapshot(metas, logs)


def last_stable_offset(log_start: int, end: int, producers: Iterable[Any]) -> int:
    """min(high watermark, where each open transaction starts), never below the log start (Kafka's LSO)."""
    stable = end
    for value in producers:
        first = int(value.get("txn_first", -1)) if isinstance(value, dict) else -1
        if 0 <= first < stable:
            stable = first
    return max(stable, min(log_start, end))


def _partition_rows(name: str, rows: Iterable[tuple[str, Any]], states: dict[tuple[str, int], Any],
                    segments: dict[tuple[str, int], list[Any]], producers: dict[tuple[str, int], list[Any]]) -> None:
    """Sort the records under partitions/{name}/ (relative keys, unpacked values) by partition and kind."""
    for key, value in rows:
        _, _, p, kind, *_ = key.split("/", 4)
        if kind == "state":
            states[(name, int(p))] = value
        elif kind == "segments":
            segments.setdefault((name, int(p)), []).append(value)
        elif kind == "producers":
            producers.setdefault((name, int(p)), []).append(value)


def _sqlite_snapshot(path: str, topics: list[str] | None, pattern: str | None) -> Snapshot:
    conn = _sqlite_connect(path)
    try:
        # One read transaction: every row below comes from the same committed state of the store.
        conn.execute("BEGIN")
        topic_values = _sqlite_topics(conn)
        selected = select_topics(topic_values, topics=topics, pattern=pattern)
        states: dict[tuple[str, int], Any] = {}
        segments: dict[tuple[str, int], list[Any]] = {}
        producers: dict[tuple[str, int], list[Any]] = {}
        for name in selected:
            prefix = keys.partition_prefix(name).encode()
            rows = conn.execute("SELECT key, value FROM kv WHERE key >= ? AND key < ?", (prefix, prefix[:-1] + b"0"))
            _partition_rows(name, ((bytes(k).decode(), msgpack.unpackb(v, raw=False)) for k, v in rows),
                            states, segments, producers)
        conn.execute("COMMIT")
    except sqlite3.OperationalError as exc:
        raise FileNotFoundError(f"cannot read the Kafscale metadata store at {path}: {exc}") from exc
    finally:
        conn.close()
    return _build(topic_values, selected, states, segments, producers)


def _sqlite_connect(path: str) -> sqlite3.Connection:
    if not os.path.exists(path):
        raise FileNotFoundError(f"no Kafscale metadata store at {path} (is kafscale.data.dir a broker's --data-dir?)")
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)


def _sqlite_topics(conn: sqlite3.Connection) -> dict[str, Any]:
    rows = conn.execute("SELECT key, value FROM kv WHERE key >= ? AND key < ?",
                        (keys.TOPICS.encode(), b"topics0")).fetchall()
    return {bytes(k).decode()[len(keys.TOPICS):]: msgpack.unpackb(v, raw=False) for k, v in rows}


async def _etcd_topic_names(location: Location) -> list[str]:
    store = _etcd_store(location)
    try:
        return sorted(kv.key[len(keys.TOPICS):] for kv in await store.range(keys.TOPICS))
    finally:
        await store.close()


def _etcd_store(location: Location) -> MetadataStore:
    return metadata_store_from_settings(data_dir=None, etcd_endpoints=location.etcd_endpoints,
                                        prefix=location.etcd_prefix)  # imports gRPC only now


async def _etcd_snapshot(location: Location, topics: list[str] | None, pattern: str | None) -> Snapshot:
    store = _etcd_store(location)
    try:
        topic_values = {kv.key[len(keys.TOPICS):]: kv.value for kv in await store.range(keys.TOPICS)}
        selected = select_topics(topic_values, topics=topics, pattern=pattern)
        # One range per topic: its pages are all read at the revision of the first, so each partition's
        # state, segments and producers come from one committed state of the store (the broker commits
        # them in one transaction).
        ranges = await asyncio.gather(*(store.range(keys.partition_prefix(name)) for name in selected))
    finally:
        await store.close()
    states: dict[tuple[str, int], Any] = {}
    segments: dict[tuple[str, int], list[Any]] = {}
    producers: dict[tuple[str, int], list[Any]] = {}
    for name, kvs in zip(selected, ranges, strict=True):
        _partition_rows(name, ((kv.key, kv.value) for kv in kvs), states, segments, producers)
    return _build(topic_values, selected, states, segments, producers)
