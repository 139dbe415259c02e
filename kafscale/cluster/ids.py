"""The cluster's ids kept in the metadata store: the cluster id, and producer ids for idempotent producers."""

from __future__ import annotations

import uuid

from kafscale.cluster import keys
from kafscale.storage.metadata_store import Compare, MetadataStore, Put

FIRST_PRODUCER_ID = 1000


async def cluster_id(meta: MetadataStore) -> str:
    """Made by the first shard to ask; every other shard, and every restart, reads the same one."""
    kv = await meta.get(keys.CLUSTER)
    if kv is None:
        await meta.txn([Compare(keys.CLUSTER, "version", "==", 0)],
                       [Put(keys.CLUSTER, {"cluster_id": uuid.uuid4().hex[:22]})])
        kv = await meta.get(keys.CLUSTER)
    assert kv is not None
    return str(kv.value["cluster_id"])


async def allocate_producer_id(meta: MetadataStore) -> int:
    """A new id: compare-and-swap on one counter, so two shards never hand out the same one and none is reused."""
    while True:
        kv = await meta.get(keys.PRODUCER_ID_NEXT)
        current = int(kv.value) if kv else FIRST_PRODUCER_ID
        seen = kv.mod_revision if kv else 0
        result = await meta.txn([Compare(keys.PRODUCER_ID_NEXT, "mod_revision", "==", seen)],
                                [Put(keys.PRODUCER_ID_NEXT, current + 1)])
        if result.succeeded:
            return current
