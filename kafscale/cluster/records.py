"""Records the metadata store keeps about a partition's log (the values under kafscale.cluster.keys)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kafscale.storage import keys as object_keys


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """A transaction a marker aborted in one partition: its records are offsets [first_offset, last_offset] of
    that producer (last_offset is the marker's)."""

    producer_id: int
    first_offset: int
    last_offset: int

    def to_value(self) -> list[int]:
        return [self.producer_id, self.first_offset, self.last_offset]

    @classmethod
    def from_value(cls, v: list[int]) -> AbortedTxn:
        return cls(int(v[0]), int(v[1]), int(v[2]))


@dataclass(frozen=True, slots=True)
class StoredAt:
    """Where a committed segment's bytes and its index's lie: a segment of its own is a whole object (and its
    index another), a packed one (a virtual partition's, or a plain topic's flushed with `pack_segments`) is a byte
    range of a pack, its index right after it."""

    key: str
    start: int  # the segment's first byte in `key`
    size: int
    whole: bool  # `key` holds this segment alone: read it whole
    index_key: str
    index_start: int
    index_size: int | None  # None: the whole `index_key` object


@dataclass(frozen=True, slots=True)
class SegmentMeta:
    """What the metadata store records for each committed segment."""

    base: int
    last: int
    size: int
    records: int
    min_ts: int
    max_ts: int
    crc: int
    created_ms: int
    key_epoch: int = 0  # which object key holds it (see kafscale.storage.keys): 0 = the plain key
    # A segment stored in a pack object (kafscale.storage.pack): the pack's key below the topic's directory
    # ("{physical}/pack-{id}.kfp" for a virtual partition's, "packs/pack-{id}.kfp" for a plain topic's), where the
    # segment starts in it, and the size of the index that follows it. "" for a segment in an object of its own.
    pack: str = ""
    position: int = 0
    index_size: int = 0
    # The transactions aborted by markers in this segment, (producer id, first offset, marker offset) each: the
    # partition's aborted-transaction index, which read_committed fetches list (docs/format.md).
    aborted: tuple[AbortedTxn, ...] = ()
    # The cleaning pass that wrote it (kafscale.compaction; its key's -c variant): a compacted segment, whose
    # batches may leave gaps in [base, last]. 0: the segment as flushed.
    cleaned: int = 0

    def to_value(self) -> dict[str, Any]:
        value: dict[str, Any] = {
            "base": self.base, "last": self.last, "size": self.size, "records": self.records, "min_ts": self.min_ts,
            "max_ts": self.max_ts, "crc": self.crc, "created_ms": self.created_ms, "key_epoch": self.key_epoch}
        if self.pack:
            value.update(pack=self.pack, position=self.position, index_size=self.index_size)
        if self.aborted:
            value["aborted"] = [a.to_value() for a in self.aborted]
        if self.cleaned:
            value["cleaned"] = self.cleaned
        return value

    @classmethod
    def from_value(cls, v: dict[str, Any]) -> SegmentMeta:
        return cls(v["base"], v["last"], v["size"], v["records"], v["min_ts"], v["max_ts"], v["crc"],
                   v["created_ms"], v.get("key_epoch", 0), v.get("pack", ""), v.get("position", 0),
                   v.get("index_size", 0), tuple(AbortedTxn.from_value(a) for a in v.get("aborted", ())),
                   v.get("cleaned", 0))

    def stored(self, namespace: str, topic: str, partition: int) -> StoredAt:
        """Where this segment of a topic's partition is in the object store."""
        if self.pack:
            key = object_keys.pack_key(namespace, topic, self.pack)
            return StoredAt(key, self.position, self.size, False, key, self.position + self.size, self.index_size)
        segment = object_keys.segment_key(namespace, topic, partition, self.base, self.key_epoch, self.cleaned)
        index = object_keys.index_key(namespace, topic, partition, self.base, self.key_epoch, self.cleaned)
        return StoredAt(segment, 0, self.size, True, index, 0, None)

    @classmethod
    def from_info(cls, info: Any, key_epoch: int = 0, pack: str = "", position: int = 0,
                  index_size: int = 0, aborted: tuple[AbortedTxn, ...] = ()) -> SegmentMeta:
        return cls(info.base_offset, info.last_offset, info.size, info.record_count, info.min_timestamp,
                   info.max_timestamp, info.crc, info.created_ms, key_epoch, pack, position, index_size, aborted)
