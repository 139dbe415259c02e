"""The cluster as `kafscale cluster info` shows it: nodes -> shards -> partitions and groups, read from the store.

Read from the metadata store, not asked of the shards, so a dead shard's work shows where placement still
puts it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from kafscale.cluster import keys
from kafscale.cluster import placement_store as store
from kafscale.cluster.placement import group_slot
from kafscale.storage.metadata_store import MetadataStore


async def layout(meta: MetadataStore) -> dict[str, Any]:
    wanted = await store.wanted_shards(meta)
    live = await store.live_shards(meta)
    infos = await store.topics(meta)
    slots = await store.group_slots(meta) or []
    drained = await store.draining(meta)
    groups = [unquote(kv.key[len(keys.GROUPS):]) for kv in await meta.range(keys.GROUPS)]
    shards: dict[int, dict[str, Any]] = {}

    def shard(s: int) -> dict[str, Any]:
        if s not in shards:
            b = live.get(s)
            where = b or wanted.get(s)
            shards[s] = {"id": s, "node_id": where.node_id if where else "", "node_ip": where.node_ip if where else "",
                         "host": where.host if where else "", "port": where.port if where else 0,
                         "live": b is not None, "draining": s in drained, "partitions": [], "group_slots": [],
                         "groups": []}
        return shards[s]

    for s in sorted(set(wanted) | set(live)):
        shard(s)
    for (topic, p), s in sorted(store.partition_assignment(infos).items()):
        shard(s)["partitions"].append(f"{topic}-{p}")
    for i, s in enumerate(slots):
        shard(s)["group_slots"].append(i)
    for g in groups:
        if slots:
            shard(slots[group_slot(g)])["groups"].append(g)
    nodes: dict[str, dict[str, Any]] = {}
    for entry in shards.values():
        nodes.setdefault(entry["node_id"], {"node_id": entry["node_id"], "node_ip": entry["node_ip"],
                                            "shards": []})["shards"].append(entry)
    return {"nodes": list(nodes.values())}
