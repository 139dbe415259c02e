"""`kafscale metadata snapshot|restore|rebuild`: metadata backups in the object store, and a metadata store
rebuilt from them (docs/operations.md, "Backups and restores"). They take the same store flags as `serve`
(`--data-dir`, `--etcd-endpoints`, `--s3-bucket`, ...), and work on the stores directly: the embedded store is
held by a running broker, so stop it first; etcd can be snapshotted while the cluster runs."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from typing import Any

from kafscale import config


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("metadata", help="snapshot the metadata to the object store, or restore it")
    sub = parser.add_subparsers(dest="metadata_command", required=True)
    for name, text in (("snapshot", "write a snapshot of the metadata to the object store now"),
                       ("restore", "fill an empty metadata store from the newest snapshot, rolled forward from "
                                   "the segments"),
                       ("rebuild", "fill an empty metadata store from the segments alone (no snapshot: groups, "
                                   "offsets, users and ACLs are lost)")):
        p = sub.add_parser(name, help=text)
        config.add_arguments(p)
        p.add_argument("--output", choices=["text", "json"], default="text")
        p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kafscale.broker import snapshot
    from kafscale.commands.client import emit
    from kafscale.storage.async_store import AsyncObjectStore
    from kafscale.storage.metadata_store import MetadataStoreError
    from kafscale.storage.metadata_stores import metadata_store_from_settings
    from kafscale.storage.object_store import ObjectStoreError
    from kafscale.storage.object_stores import object_store_from_settings

    try:
        settings = config.load(args)
    except config.ConfigError as e:
        print(f"kafscale: {e}", file=sys.stderr)
        return 2

    async def work() -> Any:
        meta = metadata_store_from_settings(data_dir=settings.data_dir, etcd_endpoints=settings.etcd_endpoint_list(),
                                            prefix=settings.etcd_prefix)
        objects = AsyncObjectStore(object_store_from_settings(
            data_dir=settings.data_dir, s3_endpoint=settings.s3_endpoint, s3_bucket=settings.s3_bucket,
            s3_region=settings.s3_region, s3_access_key=settings.s3_access_key,
            s3_secret_key=settings.s3_secret_key))
        try:
            if args.metadata_command == "snapshot":
                taken = await snapshot.take(meta, objects, settings.s3_namespace)
                await snapshot.prune(objects, settings.s3_namespace, settings.metadata_snapshots_kept)
                return taken
            if args.metadata_command == "restore":
                return await snapshot.restore(meta, objects, settings.s3_namespace)
            return await snapshot.rebuild(meta, objects, settings.s3_namespace)
        finally:
            await meta.close()
            objects.close()

    try:
        result = asyncio.run(work())
    except (snapshot.SnapshotError, MetadataStoreError, ObjectStoreError, ValueError) as e:
        print(f"kafscale metadata {args.metadata_command}: {e}", file=sys.stderr)
        return 1
    emit(args, dataclasses.asdict(result), _text)
    return 0


def _text(d: dict[str, Any]) -> str:
    if "revision" in d:
        return f"snapshot {d['key']}: {d['keys']} keys at revision {d['revision']}, {d['bytes']:,} bytes"
    source = f"snapshot {d['snapshot']} ({d['keys']} keys)" if d["snapshot"] else "the segments alone"
    return (f"restored from {source}: {d['partitions']} partition(s) rolled forward over {d['segments']} "
            "segment(s) found in the object store")
