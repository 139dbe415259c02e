"""Pick the MetadataStore backend from deployment settings: etcd when endpoints are given, else embedded.

The one factory for every process: the metadata actor (which hosts the embedded store), the shards
(which reach that actor's store: they pass ``embedded``), and the pipeline (etcd only: it reads the
embedded file itself, read-only, next to a live broker).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kafscale.storage.metadata_store import MetadataStore


def metadata_store_from_settings(
    *,
    data_dir: str | None,
    etcd_endpoints: str | list[str] | None,
    prefix: str = "/kafscale/",
    embedded: Callable[[], MetadataStore] | None = None,
) -> MetadataStore:
    """EtcdStore(etcd_endpoints, prefix=prefix), or EmbeddedStore(data_dir/metadata.db) without endpoints.

    etcd is shared by nature: every process connects itself. The embedded store has one writer; a process
    that reaches it elsewhere (a shard, through the metadata actor) passes ``embedded``, which is called
    instead of opening the file when no endpoints are given. The prefix only namespaces etcd keys: the
    embedded file belongs to one deployment anyway.
    """
    if etcd_endpoints:
        from kafscale.storage.etcd_store import EtcdStore  # keeps gRPC out of single-node processes

        return EtcdStore(etcd_endpoints, prefix=prefix)
    if embedded is not None:
        return embedded()
    if not data_dir:
        raise ValueError("either etcd_endpoints or data_dir is required for the metadata store")
    from kafscale.storage.embedded_store import EmbeddedStore

    return EmbeddedStore(Path(data_dir) / "metadata.db")
