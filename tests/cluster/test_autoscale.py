"""`--autoscale` on a 3-node Ray test cluster (1 CPU per node, every node on 127.0.0.1): load raises the shard
count, its end brings it back to the minimum, and an idempotent producer and a consumer group running throughout
lose nothing and see nothing twice.

The delays and the target are shortened so that the test takes about a minute: scale up after 2 s over a
busy fraction of 0.12 (a producer of 10 KB records at 5 MB/s, in its own process, keeps one shard of this
2-core machine above it), down after 4 s.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from kafscale.testing.etcd_server import EtcdServer
from kafscale.testing.ports import free_port
from kafscale.testing.ray_cluster import RayTestCluster, wait_until
from kafscale.testing.s3_servers import SeaweedS3Server, unique_bucket_name
from kafscale.testing.serve_process import ServeProcess
from tests.cluster.clients import GroupMember, Traffic, assert_exactly_once, create_topic, layout, read_all, start_load
from tests.cluster.conftest import NODES

PARTITIONS = 12
# Enough to keep one shard above the target here, not so much that this machine starves the shards' lease
# renewals (at 25 MB/s and more, etcd (sharing the disk and 2 cores with SeaweedFS) answered them too late, the
# leases lapsed, and healing moved work around as after a failure), nor than the read-back check needs.
LOAD_MB_S = 5


@pytest.fixture
def autoscaled(tmp_path: Path, ray_cluster: RayTestCluster, etcd_server: EtcdServer,
               seaweed_server: SeaweedS3Server) -> Iterator[ServeProcess]:
    bucket = unique_bucket_name("autoscale")
    s3 = seaweed_server
    serve = ServeProcess(tmp_path / "data", shards=NODES, ports=[free_port() for _ in range(NODES)], extra_args=[
        "--etcd-endpoints", etcd_server.endpoint, "--etcd-prefix", f"/autoscale-{uuid.uuid4().hex[:12]}/",
        "--s3-endpoint", s3.endpoint_url, "--s3-bucket", bucket, "--s3-region", s3.region,
        "--s3-access-key", s3.access_key, "--s3-secret-key", s3.secret_key,
        "--ray-address", ray_cluster.address,
        "--autoscale", "--min-shards", "1", "--max-shards", str(NODES), "--target-utilization", "0.12",
        "--scale-up-delay-s", "2", "--scale-down-delay-s", "4"])
    with serve:
        yield serve
    s3.delete_bucket(bucket)


def serving(ray_cluster: RayTestCluster) -> dict[int, list[str]]:
    """Live shards -> the partitions each leads."""
    return {s["id"]: s["partitions"] for n in layout(ray_cluster)["nodes"] for s in n["shards"] if s["live"]}


def test_load_raises_the_shard_count_and_its_end_brings_it_back_losing_nothing(
        autoscaled: ServeProcess, ray_cluster: RayTestCluster) -> None:
    assert len(serving(ray_cluster)) == 1, "an idle cluster starts at --min-shards"
    create_topic(autoscaled.bootstrap_all, "scaling", PARTITIONS)
    traffic = Traffic(autoscaled.bootstrap_all, "scaling", PARTITIONS).start()
    member = GroupMember(autoscaled.bootstrap_all, "scaling", "scaling-group")
    member.start()
    # The load: 10 KB records at LOAD_MB_S from another process (the checked producer above sends small ones).
    load = start_load(autoscaled.bootstrap_all, "scaling", PARTITIONS, 300, LOAD_MB_S)
    loaded = time.monotonic()

    # Up: more shards, partitions spread onto them, and Metadata names them.
    assert wait_until(lambda: sum(1 for parts in serving(ray_cluster).values() if parts) >= 2, 90, interval=1), \
        f"no second shard took partitions under load: {serving(ray_cluster)}"
    scaled_up = time.monotonic() - loaded
    shards = serving(ray_cluster)
    # Ray's autoscaler is asked for a CPU per wanted shard (a `ray up` cluster adds nodes for what does not fit).
    assert wait_until(lambda: len(ray_cluster.resource_request()) >= 2, 30), ray_cluster.resource_request()
    assert all(bundle == {"CPU": 1.0} for bundle in ray_cluster.resource_request())
    admin = AdminClient({"bootstrap.servers": autoscaled.bootstrap_all})
    assert {b.id for b in admin.list_topics("scaling", timeout=30).brokers.values()} >= set(shards)
    time.sleep(3)
    out, _ = load.communicate(b"", timeout=60)  # stdin closed: it stops, flushes and says how many were acked
    assert int(out) > 0
    traffic.stop()
    stopped = time.monotonic()

    # Down: back to one shard, leading every partition, after the scale-down delay.
    assert wait_until(lambda: len(serving(ray_cluster)) == 1, 120, interval=1), \
        f"the idle cluster did not shrink to one shard: {serving(ray_cluster)}"
    back = time.monotonic() - stopped
    (only,) = serving(ray_cluster).values()
    assert len(only) == PARTITIONS
    assert wait_until(lambda: ray_cluster.resource_request() == [{"CPU": 1.0}], 10), \
        f"the request to Ray's autoscaler did not shrink: {ray_cluster.resource_request()}"
    print(f"autoscale: {len(shards)} shards {scaled_up:.1f} s after the load started; back to 1 shard "
          f"{back:.1f} s after it stopped")

    stored = read_all(autoscaled.bootstrap_all, "scaling", PARTITIONS, traffic.ends())
    # The checked producer's records (the load's are acks=1: a retry may store one twice, as Kafka may).
    assert_exactly_once(traffic, {k: v for k, v in stored.items() if not v.startswith(b"load-")})
    assert wait_until(lambda: member.seen >= set(stored.values()), 60), \
        "the group did not consume every record across the scaling"
    member.stop()
