"""Metadata backups in the object store, and the metadata store rebuilt from them (or from the segments alone).

A snapshot is every key of the metadata store read at one revision (topics, configs, partition states and
segment lists, groups and their offsets, producer ids, credentials, ACLs), except what only lives while its
holder does (keys under a lease: shard registrations). It is stored, zstd-compressed msgpack, at
`{namespace}/@metadata/snapshot-{unix ms}-r{revision}` ('@' is not allowed in topic names, so no topic's
objects share the prefix).

Restoring writes the newest snapshot into an empty store, then rolls each partition forward from the segments
in the object store: what was committed after the snapshot is found by following the segments from the
snapshot's end offset (the segment at that base, then at the next base, ...). Where a base has several objects
(a dead owner's upload and its successor's `-e{epoch}` key, or the segments a cleaning replaced and its
`-e{epoch}-c{pass}` one), the run that reaches furthest wins, then the highest epoch, then the latest cleaning.
The batches are replayed as their appends were: producers' sequences, and transactions opened by data batches
and ended by markers, an abort's range going back into the aborted-transaction index of its marker's segment.
Owner epochs are raised past every epoch seen in the keys, so new owners never reuse an object key, and
offsets continue after the last segment found, so no offset is reused.

Without a snapshot, `rebuild` does the same from the object store alone: topics and their partition counts from
the keys (default configs), each partition from its lowest segment. Groups, their offsets, users and ACLs are
not in the object store and are lost.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import cramjam
import msgpack

from kafscale.broker.packed import PackedSegment, last_offset, packed_segments, virtual_layout
from kafscale.broker.producer_state import ProducerEntry, ProducerStates
from kafscale.broker.txn_state import PartitionTxns
from kafscale.cluster import keys
from kafscale.cluster.ids import FIRST_PRODUCER_ID
from kafscale.cluster.placement import spread
from kafscale.cluster.records import AbortedTxn, SegmentMeta
from kafscale.cluster.topic_configs import VIRTUAL_PARTITIONS
from kafscale.cluster.topics import TopicInfo
from kafscale.storage import keys as object_keys
from kafscale.storage.async_store import AsyncObjectStore
from kafscale.storage.control import marker_of
from kafscale.storage.metadata_store import MAX_TXN_OPS, Delete, MetadataStore, Op, Put
from kafscale.storage.object_store import ObjectInfo
from kafscale.storage.segment import SEGMENT_FOOTER_SIZE, SegmentReader, parse_segment_footer

log = logging.getLogger(__name__)
FORMAT = 1
ID_MARGIN = 10_000  # producer ids skipped after a restore (see _skip_ids)
SHARD_ID_MARGIN = 100
_EPHEMERAL = (keys.BROKERS,)  # registrations: written again by the shards that hold them


class SnapshotError(Exception):
    """A snapshot cannot be taken or restored; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    key: str
    revision: int
    created_ms: int
    keys: int
    bytes: int


@dataclass(frozen=True, slots=True)
class Restored:
    snapshot: str  # the snapshot's object key ('' for a rebuild from the segments alone)
    keys: int  # keys written from the snapshot
    partitions: int  # partitions rolled forward
    segments: int  # segments found beyond the snapshot's partition states


def prefix(namespace: str) -> str:
    return f"{namespace}/@metadata/"


async def take(meta: MetadataStore, objects: AsyncObjectStore, namespace: str) -> Snapshot:
    """Write a snapshot of the metadata store as it is now."""
    kvs = await meta.range("")  # one consistent read (etcd: all pages at the first page's revision)
    revision = max((kv.mod_revision for kv in kvs), default=0)
    kept = [[kv.key, kv.value] for kv in kvs if not kv.lease and not kv.key.startswith(_EPHEMERAL)]
    now = int(time.time() * 1000)
    body = bytes(cramjam.zstd.compress(msgpack.packb({"format": FORMAT, "revision": revision, "created_ms": now,
                                                      "keys": kept}, use_bin_type=True)))
    key = f"{prefix(namespace)}snapshot-{now:015d}-r{revision}"
    await objects.put(key, body)
    log.info("metadata snapshot %s: %d keys at revision %d, %d bytes", key, len(kept), revision, len(body))
    return Snapshot(key, revision, now, len(kept), len(body))


async def prune(objects: AsyncObjectStore, namespace: str, keep: int) -> int:
    """Delete all but the newest `keep` snapshots; returns how many went."""
    found = sorted(o.key for o in await objects.list(f"{prefix(namespace)}snapshot-"))
    old = found[:-keep] if keep > 0 else []
    if old:
        await objects.delete_many(old)
    return len(old)


async def run(meta: MetadataStore, objects: AsyncObjectStore, namespace: str, interval_s: float, keep: int,
              leads: Callable[[], bool], report: Callable[[Snapshot | None], None]) -> None:
    """Scheduled snapshots, taken by the shard for which leads() is true (the live shard with the lowest id)."""
    while True:
        await asyncio.sleep(interval_s)
        if not leads():
            continue
        try:
            taken = await take(meta, objects, namespace)
            await prune(objects, namespace, keep)
            report(taken)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the stores away: the next round tries again, and the metric shows the age
            log.warning("scheduled metadata snapshot failed: %s", e)
            report(None)


async def newest(objects: AsyncObjectStore, namespace: str) -> str | None:
    found = [o.key for o in await objects.list(f"{prefix(namespace)}snapshot-")]
    return max(found) if found else None


async def restore(meta: MetadataStore, objects: AsyncObjectStore, namespace: str) -> Restored:
    """Rebuild an empty metadata store from the newest snapshot, rolled forward from the segments."""
    await _check_empty(meta)
    key = await newest(objects, namespace)
    if key is None:
        raise SnapshotError(f"no snapshot under {prefix(namespace)} (take one with `kafscale metadata snapshot`, "
                            "or rebuild from the segments alone with `kafscale metadata rebuild`)")
    snapshot = msgpack.unpackb(bytes(cramjam.zstd.decompress(await objects.get(key))), raw=False)
    if snapshot.get("format") != FORMAT:
        raise SnapshotError(f"{key}: snapshot format {snapshot.get('format')!r}, this broker reads {FORMAT}")
    values = dict(snapshot["keys"])
    for name, value in values.items():  # a new leader epoch for every partition: clients drop older metadata
        if name.startswith(keys.TOPICS):
            value["leader_epochs"] = [e + 1 for e in value.get("leader_epochs", [])] or [1] * value["partitions"]
    by_partition: dict[tuple[str, int], dict[str, Any]] = defaultdict(dict)
    for name, value in values.items():
        parts = name.split("/")  # partitions/{topic}/{p}/...: topic names hold no '/'
        if parts[0] == "partitions" and len(parts) > 3 and parts[2].isdigit():
            by_partition[(parts[1], int(parts[2]))][name] = value
    await _write(meta, [Put(k, v) for k, v in values.items()])
    partitions = segments = 0
    top_pid = -1
    for name, value in sorted(values.items()):
        if not name.startswith(keys.TOPICS):
            continue
        info = TopicInfo.from_value(name[len(keys.TOPICS):], value)
        packed = await _packs(objects, namespace, info)
        for p in range(info.partitions):
            found, pid = await _roll_forward(meta, objects, namespace, info.name, p, values.get(keys.state(
                info.name, p)), values.get(keys.owner(info.name, p)), by_partition[(info.name, p)],
                packed.get(p, []))
            segments, top_pid, partitions = segments + found, max(top_pid, pid), partitions + 1
    await _skip_ids(meta, values, top_pid)
    log.info("metadata restored from %s: %d keys, %d partitions rolled forward over %d newer segments", key,
             len(values), partitions, segments)
    return Restored(key, len(values), partitions, segments)


async def rebuild(meta: MetadataStore, objects: AsyncObjectStore, namespace: str) -> Restored:
    """Rebuild an empty metadata store from the segments alone (no snapshot): topics with default configs."""
    await _check_empty(meta)
    found: dict[str, set[int]] = defaultdict(set)
    listed: dict[str, list[ObjectInfo]] = defaultdict(list)
    top_pid = -1
    for o in await objects.list(f"{namespace}/"):
        parsed = object_keys.parse_segment_key(o.key)
        if parsed is not None and parsed.namespace == namespace:
            found[parsed.topic].add(parsed.partition)
        topic = o.key[len(namespace) + 1:].split("/", 1)[0]
        if object_keys.pack_name_of(o.key, namespace, topic) is not None:
            listed[topic].append(o)
    packed = {topic: await packed_segments(objects, namespace, topic, objs) for topic, objs in listed.items()}
    partitions = segments = 0
    for name in sorted(found.keys() | packed.keys()):
        lanes = packed.get(name, {})
        layout = virtual_layout(lanes) if lanes else None
        count = max([*found.get(name, ()), *lanes]) + 1
        physical = 0
        if layout is not None and count <= layout[1]:  # the packs' layout: the topic as it was made (physical 0:
            count, physical = layout[1], layout[0]  # a plain topic's packs)
        units = spread(name, physical or count, [0])
        configs = {VIRTUAL_PARTITIONS: str(count)} if physical else {}
        info = TopicInfo(name, _new_id(), count, [units[p % len(units)] for p in range(count)], configs,
                         int(time.time() * 1000), [0] * count, physical)
        await meta.put(keys.topic(name), info.to_value())
        for p in range(count):
            rolled, pid = await _roll_forward(meta, objects, namespace, name, p, None, None, None, lanes.get(p, []))
            segments, top_pid, partitions = segments + rolled, max(top_pid, pid), partitions + 1
    await _skip_ids(meta, {}, top_pid)
    log.info("metadata rebuilt from the segments: %d topics, %d partitions, %d segments", len(found), partitions,
             segments)
    return Restored("", 0, partitions, segments)


async def _packs(objects: AsyncObjectStore, namespace: str, info: TopicInfo) -> dict[int, list[PackedSegment]]:
    """A topic's packed segments, by lane (partition): every pack of every physical partition of a virtual topic,
    and every pack in the topic's `packs/`, its trailer read once."""
    listed = [o for unit in range(info.units if info.physical else 0)
              for o in await objects.list(object_keys.partition_prefix(namespace, info.name, unit))]
    listed += await objects.list(object_keys.packs_prefix(namespace, info.name))
    return await packed_segments(objects, namespace, info.name, listed)


async def _roll_forward(meta: MetadataStore, objects: AsyncObjectStore, namespace: str, topic: str, partition: int,
                        state: dict[str, Any] | None, owner: dict[str, Any] | None,
                        known: dict[str, Any] | None = None,
                        packed: list[PackedSegment] | None = None) -> tuple[int, int]:
    """Bring one partition's state up to the segments in the object store (known: the snapshot's keys of this
    partition; packed: a virtual partition's segments in packs); returns the segments added, and the highest
    producer id in them (-1: none). A segment is (base, (owner epoch, cleaning pass, pack name)): a plain one's
    pack name is "", its epoch and pass the key's (0 for the plain key); a packed one's are 0."""
    known = known or {}
    in_packs = {(s.lane.base, (s.lane.epoch, 0, s.name)): s for s in packed or ()}
    pairs: dict[tuple[int, int, int], set[str]] = defaultdict(set)
    sizes: dict[tuple[int, int, int], int] = {}
    for o in await objects.list(object_keys.partition_prefix(namespace, topic, partition)):
        parsed = object_keys.parse_segment_key(o.key)
        if parsed is None or (parsed.namespace, parsed.topic, parsed.partition) != (namespace, topic, partition):
            continue  # another namespace nested under this one, or not a segment
        at = (parsed.base_offset, parsed.epoch, parsed.cleaning)
        pairs[at].add(parsed.kind)
        if parsed.kind == "kfs":
            sizes[at] = o.size
    whole = {at for at, kinds in pairs.items() if kinds == {"kfs", "index"}}  # a half upload acked nothing
    # A record names a plain segment by its key epoch and pass, a packed one by its pack (whose trailer has the
    # epoch).
    present = {(base, (epoch, cleaning, "")) for base, epoch, cleaning in whole} | {
        (base, (0, 0, name)) for base, (_, _, name) in in_packs}
    top_epoch = max([e for _, e, _ in pairs] + [s.lane.epoch for s in packed or ()], default=0)
    ops: list[Op] = []
    segments = sorted((v for k, v in known.items() if k.startswith(keys.segments(topic, partition))),
                      key=lambda v: v["base"])
    # Cleanings committed since the snapshot replaced some of its segments, whose objects the janitor may have
    # deleted already: their segments stand in for what they replaced.
    cleaned = {(base, epoch, cleaning) for base, epoch, cleaning in whole if cleaning and base < int(
        (state or {}).get("next_offset", 0))}
    if cleaned and segments:
        segments, swaps = await _with_cleanings(objects, namespace, topic, partition, segments, cleaned, sizes)
        ops += swaps
    # The snapshot's segments whose objects retention deleted since: gone from the front.
    gone = 0
    while gone < len(segments) and (segments[gone]["base"], _variant_of(segments[gone])) not in present:
        ops.append(Delete(keys.segment(topic, partition, segments[gone]["base"])))
        gone += 1
    if state is None:  # a rebuild: the log starts where the longest run of segments does
        state = {"next_offset": 0, "log_start_offset": 0, "epoch": 0}
    start = int(state["next_offset"])
    lasts = {(base, (epoch, cleaning, "")): await _last_offset(objects, namespace, topic, partition,
                                                                (base, epoch, cleaning), sizes[(base, epoch, cleaning)])
             for base, epoch, cleaning in whole if base >= start}
    lasts.update({at: await last_offset(objects, s) for at, s in in_packs.items() if at[0] >= start})
    chain = _longest_chain(lasts, start)
    log_start = int(state.get("log_start_offset", 0))
    if gone == len(segments):  # nothing of the snapshot's log is left: it starts where the chain does
        log_start = max(log_start, chain[0][0] if chain else start)
    elif gone:
        log_start = max(log_start, int(segments[gone]["base"]))
    producers, touched = ProducerStates(), set()
    producers.entries = {int(k.rsplit("/", 1)[1]): ProducerEntry.from_value(v) for k, v in known.items()
                         if k.startswith(keys.producers(topic, partition))}
    txns = PartitionTxns()  # the transactions open at the snapshot, then as the segments open and end them
    for pid, entry in producers.entries.items():
        if entry.txn_first >= 0:
            txns.began(pid, entry.txn_first)
    end = start
    for base, (epoch, cleaning, pack) in chain:
        if pack:
            s = in_packs[(base, (epoch, cleaning, pack))]
            data = await objects.get_range(s.key, s.lane.position, s.lane.size)
            reader = SegmentReader(data, key=s.key)
            aborted = _replay(reader, producers, txns, touched)
            meta_value = SegmentMeta.from_info(reader.info, 0, pack, s.lane.position, s.lane.index_size, aborted)
        else:
            key = object_keys.segment_key(namespace, topic, partition, base, epoch, cleaning)
            reader = SegmentReader(await objects.get(key), key=key)
            aborted = _replay(reader, producers, txns, touched)
            meta_value = dataclasses.replace(SegmentMeta.from_info(reader.info, epoch, aborted=aborted),
                                             cleaned=cleaning)
        ops.append(Put(keys.segment(topic, partition, base), meta_value.to_value()))
        end = reader.info.last_offset + 1
    ops += [Put(keys.producer(topic, partition, pid), producers.entries[pid].to_value()) for pid in sorted(touched)]
    owner_epoch = max(int((owner or {}).get("epoch", 0)), top_epoch, int(state.get("epoch", 0)))
    ops += [Put(keys.state(topic, partition), {**state, "next_offset": max(end, log_start),
                                               "log_start_offset": log_start, "epoch": owner_epoch}),
            Put(keys.owner(topic, partition), {**(owner or {"shard": -1}), "epoch": owner_epoch})]
    await _write(meta, ops)
    if chain or gone:
        log.info("%s-%d: rolled forward over %d segment(s) to offset %d (log start %d, %d segment(s) of the "
                 "snapshot gone)", topic, partition, len(chain), end, log_start, gone)
    return len(chain), max(touched, default=-1)


async def _with_cleanings(objects: AsyncObjectStore, namespace: str, topic: str, partition: int,
                          segments: list[dict[str, Any]], cleaned: set[tuple[int, int, int]],
                          sizes: dict[tuple[int, int, int], int]) -> tuple[list[dict[str, Any]], list[Op]]:
    """The snapshot's segment records with each run that a later cleaning replaced swapped for the cleaning's
    segment (the latest cleaning at a base; it spans exactly the records it replaced), and the store operations
    that make the swap. Its aborted-transaction index keeps the replaced records' entries whose markers it kept."""
    latest: dict[int, tuple[int, int]] = {}
    for base, epoch, cleaning in cleaned:
        latest[base] = max(latest.get(base, (0, 0)), (epoch, cleaning))
    out: list[dict[str, Any]] = []
    ops: list[Op] = []
    i = 0
    while i < len(segments):
        record, base = segments[i], int(segments[i]["base"])
        best = latest.get(base)
        if best is None or best <= _variant_of(record)[:2]:  # a packed record's variant is (0, 0, its pack)
            out.append(record)
            i += 1
            continue
        at = (base, *best)
        last = await _last_offset(objects, namespace, topic, partition, at, sizes[at])
        spanned = [r for r in segments[i:] if int(r["last"]) <= last]
        if not spanned or int(spanned[-1]["last"]) != last:  # not a cleaning of these records: leave them
            out.append(record)
            i += 1
            continue
        key = object_keys.segment_key(namespace, topic, partition, *at)
        reader = SegmentReader(await objects.get(key), key=key)
        markers = {h.base_offset for _, h in reader.batches() if h.is_control}
        aborted = tuple(a for r in spanned for a in map(AbortedTxn.from_value, r.get("aborted", ()))
                        if a.last_offset in markers)
        value = dataclasses.replace(SegmentMeta.from_info(reader.info, best[0], aborted=aborted),
                                    cleaned=best[1]).to_value()
        out.append(value)
        ops.append(Put(keys.segment(topic, partition, base), value))
        ops += [Delete(keys.segment(topic, partition, int(r["base"]))) for r in spanned[1:]]
        i += len(spanned)
    return out, ops


def _variant_of(segment: dict[str, Any]) -> Variant:
    """Which object a segment record names (see `_roll_forward`)."""
    if segment.get("pack"):
        return (0, 0, segment["pack"])
    return (int(segment.get("key_epoch", 0)), int(segment.get("cleaned", 0)), "")


def _replay(reader: SegmentReader, producers: ProducerStates, txns: PartitionTxns,
            touched: set[int]) -> tuple[AbortedTxn, ...]:
    """What a segment's batches did to the producers and the open transactions, as their appends did it: data
    batches record idempotent producers' sequences and open transactions, markers end them. Returns the
    transactions the segment's markers aborted (the segment record's aborted-transaction index)."""
    aborted = []
    for pos, header in reader.batches():
        if header.producer_id < 0 or not header.record_count:  # a batch a cleaning emptied tells nothing
            continue
        touched.add(header.producer_id)
        if header.is_control:
            marker = marker_of(reader.batch_bytes(pos, header), 0, header)
            producers.end_txn(header.producer_id, header.producer_epoch, marker.coordinator_epoch,
                              header.max_timestamp)
            ended = txns.ended(header.producer_id, header.base_offset, marker.commit)
            if ended is not None:
                aborted.append(ended)
            continue
        entry = producers.record(header, header.base_offset)
        if header.is_transactional:
            txns.began(header.producer_id, header.base_offset)
            if entry.txn_first < 0:
                entry.txn_first = header.base_offset
    return tuple(aborted)


Variant = tuple[int, int, str]  # (key epoch, cleaning pass, pack name): which object holds a segment at a base


def _longest_chain(lasts: dict[tuple[int, Variant], int], start: int) -> list[tuple[int, Variant]]:
    """The segments (base, variant) to commit past `start`: from `start` if a segment begins there, else from the
    lowest base whose run reaches furthest (retention may have removed the front). At each base the object whose
    run reaches furthest wins: an uncommitted leftover (a fenced owner's upload) ends its run where its commit
    failed, while the committed segments go on. Equal runs go to the highest variant: the highest owner epoch,
    written last (packs record the epoch of each lane's writer), and of one epoch the latest cleaning: a cleaned
    segment spans exactly the segments it replaced."""
    by_base: dict[int, list[tuple[Variant, int]]] = defaultdict(list)
    for (base, variant), last in lasts.items():
        by_base[base].append((variant, last))
    reach: dict[int, tuple[int, Variant]] = {}  # base -> (end reached, variant chosen)
    for base in sorted(by_base, reverse=True):
        reach[base] = max(((reach[last + 1][0] if last + 1 in reach else last + 1), variant)
                          for variant, last in by_base[base])
    if not reach:
        return []
    first = start if start in reach else min((b for b in reach if b >= start),
                                             key=lambda b: (-reach[b][0], b), default=None)
    chain, at = [], first
    while at is not None and at in reach:
        variant = reach[at][1]
        chain.append((at, variant))
        at = lasts[(at, variant)] + 1
    return chain


async def _last_offset(objects: AsyncObjectStore, namespace: str, topic: str, partition: int,
                       pair: tuple[int, int, int], size: int) -> int:
    key = object_keys.segment_key(namespace, topic, partition, *pair)
    tail = await objects.get_range(key, size - SEGMENT_FOOTER_SIZE, SEGMENT_FOOTER_SIZE)
    return parse_segment_footer(tail, key, object_size=size).last_offset


async def _skip_ids(meta: MetadataStore, values: dict[str, Any], top_pid: int) -> None:
    """Producer ids and shard ids are never handed out twice: ids given out after the snapshot are past what it
    recorded, so the counters move past the highest id seen in the segments and then by a margin more (ids
    given to producers that wrote nothing yet, or shards made after the snapshot)."""
    pid = max(int(values.get(keys.PRODUCER_ID_NEXT, FIRST_PRODUCER_ID)), top_pid + 1) + ID_MARGIN
    puts = [Put(keys.PRODUCER_ID_NEXT, pid)]
    if keys.NEXT_SHARD_ID in values:  # a cluster's: shards made after the snapshot had the ids just past it
        puts.append(Put(keys.NEXT_SHARD_ID, int(values[keys.NEXT_SHARD_ID]) + SHARD_ID_MARGIN))
    await meta.txn([], puts)


async def _check_empty(meta: MetadataStore) -> None:
    present = [kv.key for kv in await meta.range("") if not kv.key.startswith(_EPHEMERAL)]
    if present:
        raise SnapshotError(f"the metadata store is not empty ({len(present)} keys, e.g. {present[0]!r}): restoring "
                            "needs an empty one (a new etcd prefix or cluster, or a new --data-dir)")


async def _write(meta: MetadataStore, puts: Sequence[Op]) -> None:
    for i in range(0, len(puts), MAX_TXN_OPS):
        await meta.txn([], puts[i:i + MAX_TXN_OPS])


def _new_id() -> Any:
    import uuid

    return uuid.uuid4()
