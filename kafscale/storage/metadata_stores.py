"""Pick the MetadataStore backend from deployment settings: etcd when endpoints are given, else embedded."""

from __future__ import annotations

from pathlib import Path

from kafscale.storage.metadata_store import MetadataStore


def metadata_store_from_settings(
    *,
    data_dir: str | None,
    etcd_endpoints: str | list[str] | None,
    prefix: str = "/kafscale/",
) -> MetadataStore:
    """EtcdStore(etcd_endpoints, prefix=prefix), or EmbeddedStore(data_dir/metadata.db) without endpoints.

    The prefix only namespaces etcd keys: the embedded file belongs to one deployment anyway.
    """
    if etcd_endpoints:
        from kafscale.storage.etcd_store import EtcdStore  # keeps gRPC out of single-node processes

        return EtcdStore(etcd_endpoints, prefix=prefix)
    if not data_dir:
        raise ValueError("either etcd_endpoints or data_dir is required for the metadata store")
    from kafscale.storage.embedded_store import EmbeddedStore

    return EmbeddedStore(Path(data_dir) / "metadata.db")
