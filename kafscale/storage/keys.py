"""Object keys of segments and indexes:
``{namespace}/{topic}/{partition}/segment-{base:020d}[-e{epoch}][-c{cleaning}].kfs|.index``.

The base offset is zero-padded to 20 digits so that a lexicographic listing (what S3's ListObjectsV2
returns) is also offset order. Builders reject names that would not parse back, so every key we write
can be recognised again when a partition is recovered from a listing.

The `-e{epoch}` variant is written only when the plain key is already taken by an object a dead owner
uploaded but never committed: the owner of that epoch then writes its own key instead of deleting the
leftover, which a zombie could otherwise race with its successor. Which key holds a committed segment is
recorded in its metadata (`key_epoch`, 0 for the plain key).

The `-c{cleaning}` variant is a compacted segment (kafscale.compaction): a cleaning pass of the owner of that
epoch rewrote the segments from `base` on into it. Its own key, never the key of what it replaces, so a reader
holding the old segment list still finds the old objects, and a deposed owner's cleaning writes over nothing.
"""

from __future__ import annotations

import re
from typing import Literal, NamedTuple

__all__ = [
    "MAX_TOPIC_NAME",
    "SegmentKey",
    "index_key",
    "parse_segment_key",
    "partition_prefix",
    "segment_key",
    "topic_name_problem",
]

SEGMENT_SUFFIX = "kfs"
INDEX_SUFFIX = "index"

# Kafka's legal topic characters and maximum length (org.apache.kafka.common.internals.Topic).
MAX_TOPIC_NAME = 249
_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]+")
_PARTITION_RE = re.compile(r"0|[1-9][0-9]{0,9}")
_FILE_RE = re.compile(r"segment-([0-9]{20})(?:-e([1-9][0-9]{0,18}))?(?:-c([1-9][0-9]{0,18}))?\.(kfs|index)")
_MAX_PARTITION = 2**31 - 1
_MAX_OFFSET = 2**63 - 1


class SegmentKey(NamedTuple):
    namespace: str
    topic: str
    partition: int
    base_offset: int
    kind: Literal["kfs", "index"]
    epoch: int = 0  # the owner epoch of a `-e{epoch}` variant key; 0 for the plain key
    cleaning: int = 0  # the cleaning pass of a `-c{cleaning}` variant key; 0 for a segment as flushed


def partition_prefix(namespace: str, topic: str, partition: int) -> str:
    _check_namespace(namespace)
    if not _valid_topic(topic):
        raise ValueError(f"illegal topic name {topic!r}")
    if not 0 <= partition <= _MAX_PARTITION:
        raise ValueError(f"partition {partition} out of range")
    return f"{namespace}/{topic}/{partition}/"


def segment_key(namespace: str, topic: str, partition: int, base_offset: int, epoch: int = 0, cleaning: int = 0
                ) -> str:
    return _object_key(namespace, topic, partition, base_offset, SEGMENT_SUFFIX, epoch, cleaning)


def index_key(namespace: str, topic: str, partition: int, base_offset: int, epoch: int = 0, cleaning: int = 0
              ) -> str:
    return _object_key(namespace, topic, partition, base_offset, INDEX_SUFFIX, epoch, cleaning)


PACK_SUFFIX = "kfp"
PACKS_DIR = "packs"  # a plain topic's packs: partitions a shard flushed together (physical partitions have numbers)
_PACK_RE = re.compile(r"(0|[1-9][0-9]{0,9}|packs)/pack-[0-9a-f]{32}\.kfp")


def pack_name(physical: int | None, pack_id: str) -> str:
    """A pack's key below its topic's directory, as segment records name it (kafscale.storage.pack): in its physical
    partition's directory for a virtual topic, in the topic's `packs/` for a plain topic's (physical None)."""
    name = f"{PACKS_DIR if physical is None else physical}/pack-{pack_id}.{PACK_SUFFIX}"
    if not _PACK_RE.fullmatch(name):
        raise ValueError(f"not a pack name: {name!r}")
    return name


def pack_name_of(key: str, namespace: str, topic: str) -> str | None:
    """The pack name (as segment records hold it) of an object key under the topic's directory; None if not a pack."""
    prefix = f"{namespace}/{topic}/"
    if not key.startswith(prefix) or not _PACK_RE.fullmatch(key[len(prefix):]):
        return None
    return key[len(prefix):]


def packs_prefix(namespace: str, topic: str) -> str:
    """Where a plain topic's packs are."""
    return f"{namespace}/{topic}/{PACKS_DIR}/"


def pack_key(namespace: str, topic: str, name: str) -> str:
    """The object key of a pack a segment record names."""
    if not _PACK_RE.fullmatch(name):
        raise ValueError(f"not a pack name: {name!r}")
    return f"{namespace}/{topic}/{name}"


def parse_segment_key(key: str) -> SegmentKey | None:
    """Split a segment or index key; None for any other key (health probes, foreign objects)."""
    # Split from the right: topics cannot contain '/', namespaces can.
    parts = key.rsplit("/", 3)
    if len(parts) != 4:
        return None
    namespace, topic, partition, filename = parts
    match = _FILE_RE.fullmatch(filename)
    if match is None or not _PARTITION_RE.fullmatch(partition) or not _valid_topic(topic):
        return None
    if not _valid_namespace(namespace):
        return None
    base_offset = int(match.group(1))
    partition_id = int(partition)
    epoch, cleaning = int(match.group(2) or 0), int(match.group(3) or 0)
    if base_offset > _MAX_OFFSET or partition_id > _MAX_PARTITION or epoch > _MAX_OFFSET or cleaning > _MAX_OFFSET:
        return None
    kind: Literal["kfs", "index"] = "kfs" if match.group(4) == SEGMENT_SUFFIX else "index"
    return SegmentKey(namespace, topic, partition_id, base_offset, kind, epoch, cleaning)


def _object_key(namespace: str, topic: str, partition: int, base_offset: int, suffix: str, epoch: int,
                cleaning: int = 0) -> str:
    if not 0 <= base_offset <= _MAX_OFFSET:
        raise ValueError(f"base offset {base_offset} out of range")
    if not 0 <= epoch <= _MAX_OFFSET:
        raise ValueError(f"epoch {epoch} out of range")
    if not 0 <= cleaning <= _MAX_OFFSET:
        raise ValueError(f"cleaning {cleaning} out of range")
    variant = (f"-e{epoch}" if epoch else "") + (f"-c{cleaning}" if cleaning else "")
    return f"{partition_prefix(namespace, topic, partition)}segment-{base_offset:020d}{variant}.{suffix}"


def topic_name_problem(name: str | None) -> str | None:
    """Kafka's topic name rules, the one copy of them, and its words for a broken one; None when the name is legal."""
    if not name:
        return "Topic name is invalid: the empty string is not allowed"
    # "." and ".." are legal characters but not legal names (and would be path traversal on disk).
    if name in (".", ".."):
        return f"Topic name is invalid: '{name}' is not allowed"
    if len(name) > MAX_TOPIC_NAME:
        return f"Topic name is invalid: the length of '{name}' is longer than the max allowed length {MAX_TOPIC_NAME}"
    if _TOPIC_RE.fullmatch(name) is None:
        return (f"Topic name is invalid: '{name}' contains one or more characters other than ASCII alphanumerics, "
                "'.', '_' and '-'")
    return None


def _valid_topic(topic: str) -> bool:
    return topic_name_problem(topic) is None


def _valid_namespace(namespace: str) -> bool:
    # Empty or dot components would collapse or escape directories in the local-directory store.
    return bool(namespace) and all(part not in ("", ".", "..") for part in namespace.split("/"))


def _check_namespace(namespace: str) -> None:
    if not _valid_namespace(namespace):
        raise ValueError(f"illegal namespace {namespace!r}")
