"""The stores a process of the cluster opens from the broker's settings: a shard, the controller, a cleaning task."""

from __future__ import annotations

from typing import Any

import ray

from kafscale.config import BrokerConfig
from kafscale.storage.metadata_store import MetadataStore
from kafscale.storage.metadata_stores import metadata_store_from_settings


def open_metadata_store(config: BrokerConfig, metadata_actor: str | None, ray_namespace: str) -> MetadataStore:
    """etcd is shared by nature: every shard connects itself. The embedded store lives in one actor."""

    def embedded() -> MetadataStore:
        from kafscale.actors.metadata_actor import RemoteMetadataStore

        assert metadata_actor is not None, "embedded metadata needs the metadata actor"
        return RemoteMetadataStore(ray.get_actor(metadata_actor, namespace=ray_namespace))

    return metadata_store_from_settings(data_dir=config.data_dir, etcd_endpoints=config.etcd_endpoint_list(),
                                        prefix=config.etcd_prefix, embedded=embedded)


def open_object_store(config: BrokerConfig) -> Any:
    from kafscale.storage.object_stores import object_store_from_settings

    return object_store_from_settings(
        data_dir=config.data_dir, s3_endpoint=config.s3_endpoint or None, s3_bucket=config.s3_bucket or None,
        s3_region=config.s3_region or None, s3_access_key=config.s3_access_key or None,
        s3_secret_key=config.s3_secret_key or None, s3_create_bucket=config.s3_create_bucket,
    )
