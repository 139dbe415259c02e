"""Placement as the metadata store holds it: read it whole, and write moves with compare-and-swap.

The controller is the writer (kafscale.actors.controller); shards only read (kafscale.cluster.membership,
kafscale.cluster.topics). A move is written only if the item is still where the move found it, so a move
decided on a stale view is skipped instead of undoing a newer one.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import asdict, dataclass

from kafscale.cluster import keys
from kafscale.cluster.assign import Move
from kafscale.cluster.membership import BrokerRecord
from kafscale.cluster.placement import GROUP_SLOTS
from kafscale.cluster.topics import TopicInfo
from kafscale.storage.metadata_store import Compare, MetadataStore, Put

log = logging.getLogger(__name__)

Item = tuple[str, int]  # (topic, partition); a group slot is ("", slot)


@dataclass(frozen=True, slots=True)
class WantedShard:
    """A shard the controller wants (cluster/shards/{id}): on this node, at this port slot of its address."""

    id: int
    node_id: str
    node_ip: str
    slot: int
    host: str  # what it advertises
    port: int  # what it binds (0: any free port)

    @classmethod
    def from_value(cls, v: dict[str, object]) -> WantedShard:
        return cls(**{k: v[k] for k in cls.__dataclass_fields__})  # type: ignore[arg-type]


async def live_shards(meta: MetadataStore) -> dict[int, BrokerRecord]:
    return {int(kv.key[len(keys.BROKERS):]): BrokerRecord.from_value(kv.value) for kv in await meta.range(keys.BROKERS)}


async def wanted_shards(meta: MetadataStore) -> dict[int, WantedShard]:
    return {int(kv.key[len(keys.SHARDS):]): WantedShard.from_value(kv.value) for kv in await meta.range(keys.SHARDS)}


async def want(meta: MetadataStore, shard: WantedShard) -> None:
    await meta.put(keys.shard(shard.id), asdict(shard))


async def forget(meta: MetadataStore, shard_id: int) -> None:
    await meta.delete(keys.shard(shard_id))


async def allocate_shard_id(meta: MetadataStore) -> int:
    """A shard id never used before (broker ids must not come back with other data behind them)."""
    while True:
        kv = await meta.get(keys.NEXT_SHARD_ID)
        current = int(kv.value) if kv else 0
        result = await meta.txn([Compare(keys.NEXT_SHARD_ID, "mod_revision", "==", kv.mod_revision if kv else 0)],
                                [Put(keys.NEXT_SHARD_ID, current + 1)])
        if result.succeeded:
            return current


async def draining(meta: MetadataStore) -> set[int]:
    kv = await meta.get(keys.DRAINING)
    return set(kv.value["shards"]) if kv else set()


async def set_draining(meta: MetadataStore, shards: set[int]) -> None:
    await meta.put(keys.DRAINING, {"shards": sorted(shards)})


@dataclass(frozen=True, slots=True)
class ScaleState:
    """What the controller's autoscaling has decided, kept so that a restarted controller carries it on."""

    desired: int
    removing: tuple[int, ...] = ()  # shards being drained to be stopped
    reason: str = ""


async def scale_state(meta: MetadataStore) -> ScaleState | None:
    kv = await meta.get(keys.AUTOSCALE)
    if kv is None:
        return None
    return ScaleState(int(kv.value["desired"]), tuple(kv.value.get("removing", ())), str(kv.value.get("reason", "")))


async def set_scale_state(meta: MetadataStore, state: ScaleState) -> None:
    await meta.put(keys.AUTOSCALE, {"desired": state.desired, "removing": list(state.removing),
                                    "reason": state.reason})


async def topics(meta: MetadataStore) -> dict[str, TopicInfo]:
    return {kv.key[len(keys.TOPICS):]: TopicInfo.from_value(kv.key[len(keys.TOPICS):], kv.value)
            for kv in await meta.range(keys.TOPICS)}


def partition_assignment(infos: dict[str, TopicInfo]) -> dict[Item, int]:
    """What moves between shards, and where it is: each physical partition (its virtual ones move with it)."""
    return {(name, p): info.placement[p] for name, info in infos.items() for p in range(info.units)}


async def group_slots(meta: MetadataStore) -> list[int] | None:
    kv = await meta.get(keys.GROUP_SLOTS)
    return list(kv.value["slots"]) if kv else None


def slot_assignment(slots: list[int] | None) -> dict[Item, int]:
    return {("", i): shard for i, shard in enumerate(slots or [])}


async def ensure_group_slots(meta: MetadataStore, shard_ids: list[int]) -> None:
    """The first slot map, spread over the shards there are (written once; moves change it after)."""
    ids = sorted(shard_ids)
    if not ids:
        return
    slots = [ids[i % len(ids)] for i in range(GROUP_SLOTS)]
    await meta.txn([Compare(keys.GROUP_SLOTS, "version", "==", 0)],
                   [Put(keys.GROUP_SLOTS, {"slots": slots, "epochs": [0] * GROUP_SLOTS})])


async def write_moves(meta: MetadataStore, moves: list[Move]) -> list[Move]:
    """Apply moves (partitions and group slots); returns those written (an item no longer at its move's
    source is left as it is)."""
    by_topic: dict[str, list[Move]] = defaultdict(list)
    for m in moves:
        topic, _ = m.item  # type: ignore[misc]
        by_topic[topic].append(m)
    done: list[Move] = []
    for topic, group in by_topic.items():
        done += await (_write_slots(meta, group) if topic == "" else _write_partitions(meta, topic, group))
    return done


async def _write_partitions(meta: MetadataStore, topic: str, moves: list[Move]) -> list[Move]:
    while True:
        kv = await meta.get(keys.topic(topic))
        if kv is None:
            return []
        info = TopicInfo.from_value(topic, kv.value)
        applied = []
        for m in moves:
            _, p = m.item  # type: ignore[misc]
            if p < info.partitions and info.placement[p] == m.source:
                info = info.moved(p, m.target)
                applied.append(m)
        if not applied:
            return []
        result = await meta.txn([Compare(keys.topic(topic), "mod_revision", "==", kv.mod_revision)],
                                [Put(keys.topic(topic), info.to_value())])
        if result.succeeded:
            return applied


async def _write_slots(meta: MetadataStore, moves: list[Move]) -> list[Move]:
    while True:
        kv = await meta.get(keys.GROUP_SLOTS)
        if kv is None:
            return []
        slots = list(kv.value["slots"])
        epochs = list(kv.value.get("epochs", [0] * len(slots)))
        applied = []
        for m in moves:
            _, i = m.item  # type: ignore[misc]
            if i < len(slots) and slots[i] == m.source:
                slots[i] = m.target
                epochs[i] += 1
                applied.append(m)
        if not applied:
            return []
        result = await meta.txn([Compare(keys.GROUP_SLOTS, "mod_revision", "==", kv.mod_revision)],
                                [Put(keys.GROUP_SLOTS, {"slots": slots, "epochs": epochs})])
        if result.succeeded:
            return applied
