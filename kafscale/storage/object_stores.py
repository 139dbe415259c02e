"""Pick the ObjectStore backend from broker settings: S3 when a bucket is configured, else a directory."""

from __future__ import annotations

from pathlib import Path

from kafscale.storage.local_store import LocalDirStore
from kafscale.storage.object_store import ObjectStore
from kafscale.storage.s3_store import S3Store


def object_store_from_settings(
    *,
    data_dir: str | None,
    s3_endpoint: str | None,
    s3_bucket: str | None,
    s3_region: str | None,
    s3_access_key: str | None = None,
    s3_secret_key: str | None = None,
    s3_create_bucket: bool = False,
) -> ObjectStore:
    """Empty strings count as unset, because that is how the CLI and config file spell "not given".

    Without a bucket the embedded store lives in data_dir/objects. Credentials left unset fall back
    to boto3's default chain (environment, profile, instance role).
    """
    if s3_bucket:
        return S3Store(
            s3_bucket,
            endpoint_url=s3_endpoint or None,
            region=s3_region or "us-east-1",
            access_key=s3_access_key or None,
            secret_key=s3_secret_key or None,
            create_bucket=s3_create_bucket,
        )
    if not data_dir:
        raise ValueError("object store: neither an S3 bucket nor a data directory is configured")
    return LocalDirStore(Path(data_dir) / "objects")
