"""Brokers for the pipeline tests: small segments and a short flush interval, so that a topic of a few
thousand records spans many segments. `deployment_cloud` writes to real etcd + SeaweedFS;
`deployment_embedded` uses the --data-dir layout (data_dir/metadata.db, data_dir/objects) that the
pipeline reads with kafscale.data.dir, next to the live broker."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kafscale.config import BrokerConfig
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.etcd_store import EtcdStore
from kafscale.storage.local_store import LocalDirStore
from kafscale.storage.object_store import ObjectStore
from kafscale.testing.etcd_server import EtcdServer
from kafscale.testing.inprocess import InProcessBroker
from kafscale.testing.s3_servers import SeaweedS3Server, unique_bucket_name

NAMESPACE = "default"
SEGMENT_BYTES = 16 * 1024


@dataclass
class Deployment:
    name: str
    broker: InProcessBroker
    objects: ObjectStore  # the test's own client of the broker's store
    options: dict[str, str]  # where the data lives, as kafscale.* Spark options

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap


def _config() -> BrokerConfig:
    return BrokerConfig(shards_per_node=1, s3_namespace=NAMESPACE, segment_bytes=SEGMENT_BYTES, flush_interval_ms=20,
                        log_cleaner_backoff_ms=500)  # compacted topics are cleaned promptly


@pytest.fixture(scope="session")
def deployment_cloud(etcd_server: EtcdServer, seaweed_server: SeaweedS3Server) -> Iterator[Deployment]:
    prefix = f"/kafscale-pipeline-{uuid.uuid4().hex[:12]}/"
    bucket = unique_bucket_name("kafscale-pipe")
    broker = InProcessBroker(_config(), meta=lambda: EtcdStore(etcd_server.endpoint, prefix=prefix),
                             objects=lambda: seaweed_server.store(bucket, create_bucket=True)).start()
    view = seaweed_server.store(bucket, create_bucket=False)
    options = {
        "kafscale.s3.endpoint": seaweed_server.endpoint_url,
        "kafscale.s3.bucket": bucket,
        "kafscale.s3.region": seaweed_server.region,
        "kafscale.s3.namespace": NAMESPACE,
        "kafscale.s3.access.key": seaweed_server.access_key,
        "kafscale.s3.secret.key": seaweed_server.secret_key,
        "kafscale.etcd.endpoints": etcd_server.endpoint,
        "kafscale.etcd.prefix": prefix,
    }
    try:
        yield Deployment("cloud", broker, view, options)
    finally:
        try:
            broker.stop()
        finally:
            view.close()
            seaweed_server.delete_bucket(bucket)


@pytest.fixture(scope="session")
def deployment_embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    data_dir: Path = tmp_path_factory.mktemp("data")
    broker = InProcessBroker(_config(), meta=lambda: EmbeddedStore(data_dir / "metadata.db"),
                             objects=lambda: LocalDirStore(data_dir / "objects")).start()
    view = LocalDirStore(data_dir / "objects")
    try:
        yield Deployment("embedded", broker, view, {"kafscale.data.dir": str(data_dir)})
    finally:
        try:
            broker.stop()
        finally:
            view.close()


def unique_topic(hint: str) -> str:
    return f"{re.sub(r'[^A-Za-z0-9._-]+', '-', hint)[:40]}-{uuid.uuid4().hex[:8]}"
