"""Where a deployment keeps its data, named like the broker's flags, and the stores that read it.

`--data-dir` is `kafscale.data.dir`, `--s3-bucket` is `kafscale.s3.bucket`, and so on: the option is the
flag with dashes turned into dots. Object stores are cached per process because Spark runs many tasks
in one Python worker, and building a boto3 client costs tens of milliseconds.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, fields

from kafscale.storage.object_store import ObjectStore
from kafscale.storage.object_stores import object_store_from_settings

__all__ = ["Location", "objects_for"]


@dataclass(frozen=True, slots=True)
class Location:
    """Picklable: it travels inside every Spark input partition."""

    data_dir: str = ""
    s3_endpoint: str = ""
    s3_bucket: str = ""
    s3_region: str = "us-east-1"
    s3_namespace: str = "default"
    s3_access_key: str = ""
    s3_secret_key: str = ""
    etcd_endpoints: str = ""
    etcd_prefix: str = "/kafscale/"

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> Location:
        """Spark options (case-insensitive) or any mapping with keys like ``kafscale.s3.bucket``.

        Unset credentials fall back to KAFSCALE_S3_ACCESS_KEY / KAFSCALE_S3_SECRET_KEY (what `kafscale serve`
        reads), then to boto3's own chain."""
        lowered = {str(k).lower(): str(v) for k, v in options.items()}
        values: dict[str, str] = {}
        for f in fields(cls):
            option = "kafscale." + f.name.replace("_", ".")
            env = "KAFSCALE_" + f.name.upper()
            if option in lowered:
                values[f.name] = lowered[option]
            elif f.name in ("s3_access_key", "s3_secret_key") and os.environ.get(env):
                values[f.name] = os.environ[env]
        location = cls(**values)
        if not location.s3_bucket and not location.data_dir:
            raise ValueError("say where the data lives: option kafscale.data.dir, or kafscale.s3.bucket"
                             " with kafscale.etcd.endpoints")
        if location.s3_bucket and not location.etcd_endpoints and not location.data_dir:
            raise ValueError("kafscale.s3.bucket needs kafscale.etcd.endpoints (or kafscale.data.dir for the"
                             " embedded metadata store): committed offsets live there, not in the bucket")
        return location

    @property
    def namespace(self) -> str:
        return self.s3_namespace

    def metadata_path(self) -> str:
        """The embedded metadata store of a broker started with --data-dir (see metadata_store_from_settings)."""
        return os.path.join(self.data_dir, "metadata.db")


_stores: dict[Location, ObjectStore] = {}
_lock = threading.Lock()


def objects_for(location: Location) -> ObjectStore:
    """The object store a location names, built once per process."""
    with _lock:
        store = _stores.get(location)
        if store is None:
            store = object_store_from_settings(
                data_dir=location.data_dir or None,
                s3_endpoint=location.s3_endpoint or None,
                s3_bucket=location.s3_bucket or None,
                s3_region=location.s3_region or None,
                s3_access_key=location.s3_access_key or None,
                s3_secret_key=location.s3_secret_key or None,
            )
            _stores[location] = store
        return store
