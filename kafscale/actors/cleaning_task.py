"""Cleaning passes as Ray tasks: the CPU a compaction pass needs (decode, key map, rewrite, compress) comes from
whichever node Ray finds it on, not from the shard's process. The task opens its own connection to the object
store from the broker's settings, so segment bytes never travel through the shard or Ray's object store; only the
job (segment records) goes out and the outcome (new segment records, figures) comes back. Objects in a local
directory (no S3 bucket) are only on the shard's node: the task is pinned there."""

from __future__ import annotations

import dataclasses
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from kafscale.actors.stores import open_object_store
from kafscale.broker.cleaning import Offload, clean_at_low_priority
from kafscale.compaction.cleaner import Job, Outcome
from kafscale.config import BrokerConfig
from kafscale.storage.object_store import ObjectStore


@ray.remote(num_cpus=1, max_retries=0)  # a pass retried is the next round's business, with a fresh job
def _clean(job: Job, config: dict[str, Any]) -> Outcome:
    store = open_object_store(BrokerConfig(**config))
    try:
        return clean_at_low_priority(job, store)
    finally:
        store.close()


def ray_offload(config: BrokerConfig) -> Offload:
    """An Offload that runs each pass as a Ray task against the store `config` names."""
    settings = dataclasses.asdict(config)
    task = _clean
    if not config.s3_bucket:
        node = ray.get_runtime_context().get_node_id()
        task = _clean.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))

    async def offload(job: Job, store: ObjectStore) -> Outcome:
        del store  # the task opens its own
        outcome: Outcome = await task.remote(job, settings)
        return outcome

    return offload
