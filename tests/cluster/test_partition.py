"""A network partition: one node of the cluster cut off while its shard stays alive.

The node is a real separate host as far as addresses go (a network namespace with its own IP, joined to this
one by a veth pair; kafscale.testing.netns). etcd, the S3 server, the Ray head and a second node listen on the
root side of the pair, so everything is reachable from both sides until the link is cut.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kafscale.protocol.errors import ErrorCode
from kafscale.testing.etcd_server import EtcdServer
from kafscale.testing.netns import TestHost, available
from kafscale.testing.ports import free_port
from kafscale.testing.ray_cluster import RayTestCluster, wait_until
from kafscale.testing.s3_servers import MotoS3Server
from kafscale.testing.serve_process import ServeProcess
from tests.cluster.clients import HEAL_BOUND_S, Traffic, assert_exactly_once, create_topic, kafscale, read_all
from tests.integration.conftest import KafkaWire

pytestmark = pytest.mark.skipif(available() is not None, reason=f"no test hosts here: {available()}")

PARTITIONS = 6


@pytest.fixture(scope="module")
def test_host() -> Iterator[TestHost]:
    with TestHost() as host:
        yield host


@pytest.fixture(scope="module")
def cut_off_cluster(test_host: TestHost, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Two nodes on the host side, one in the namespace; etcd and S3 on the host side of the link."""
    root = tmp_path_factory.mktemp("partition")
    etcd = EtcdServer(root / "etcd", host=test_host.host_ip)
    etcd.start()
    s3 = MotoS3Server(host=test_host.host_ip)
    ray_cluster = RayTestCluster(nodes=2, ip=test_host.host_ip).start()
    try:
        ray_cluster.add_node_in(test_host)
        ports = [free_port() for _ in range(2)]
        serve = ServeProcess(root / "data", shards=1, ports=ports, extra_args=[
            "--ray-address", ray_cluster.address, "--listen", f"{{node_ip}}:{ports[0]}",
            "--shard-ports", ",".join(map(str, ports)), "--shards-per-node", "1", "--flush-interval-ms", "20",
            "--etcd-endpoints", etcd.endpoint, "--s3-endpoint", s3.endpoint_url, "--s3-bucket", "cut",
            "--s3-access-key", "test", "--s3-secret-key", "test", "--metrics-listen", ""])
        with serve:
            bootstrap = ",".join(f"{ip}:{port}" for ip in (test_host.host_ip, test_host.node_ip) for port in ports)
            yield {"serve": serve, "ray": ray_cluster, "bootstrap": bootstrap}
    finally:
        ray_cluster.stop()
        s3.stop()
        etcd.stop()


def test_a_cut_off_node_is_replaced_and_fenced_and_serves_nothing_stale_when_it_returns(
        cut_off_cluster: dict[str, Any], test_host: TestHost) -> None:
    ray_cluster: RayTestCluster = cut_off_cluster["ray"]
    bootstrap = cut_off_cluster["bootstrap"]
    create_topic(bootstrap, "cut", PARTITIONS)
    info = json.loads(kafscale("cluster", "info", "--ray-address", ray_cluster.address, "-o", "json").stdout)
    shards = {s["id"]: s for n in info["nodes"] for s in n["shards"]}
    assert len(shards) == 3 and all(s["live"] for s in shards.values())
    isolated = next(s for s in shards.values() if s["node_ip"] == test_host.node_ip)
    assert isolated["host"] == test_host.node_ip, "a shard must advertise its own node's address"
    lost = sorted(int(p.rsplit("-", 1)[1]) for p in isolated["partitions"])
    assert lost, "the namespaced node's shard leads no partition"

    traffic = Traffic(bootstrap, "cut", PARTITIONS).start()
    time.sleep(3)
    cut_at = time.monotonic()
    test_host.cut()
    try:
        healing = traffic.healed(cut_at, settle=10)
        print(f"served again after the cut, per partition: { {p: round(t, 2) for p, t in healing.items()} } s"
              f" (cut off: {lost})")
        assert all(healing[p] <= HEAL_BOUND_S for p in range(PARTITIONS)), healing
    finally:
        test_host.heal()
    traffic.stop()
    stored = read_all(bootstrap, "cut", PARTITIONS, traffic.ends())
    assert_exactly_once(traffic, stored)

    # Back on the network, the old shard can neither commit (its owners' epochs were taken over) nor answer
    # with what it had: whatever it says about its old partitions is the new leaders' word, or a refusal.
    ends = {p: 1 + max(o for q, o in stored if q == p) for p in lost}
    assert wait_until(lambda: _answers(test_host.node_ip, isolated["port"], lost) is not None, 60)
    for p, (error, offset) in (_answers(test_host.node_ip, isolated["port"], lost) or {}).items():
        assert error == ErrorCode.not_leader_or_follower or (error == 0 and offset == ends[p]), (p, error, offset)


def _answers(host: str, port: int, partitions: list[int]) -> dict[int, tuple[int, int]] | None:
    """ListOffsets(latest) of each partition, asked of the shard at host:port; None while it is unreachable."""
    try:
        with KafkaWire(port, timeout=5, host=host) as wire:
            out = {}
            for p in partitions:
                answer = wire.list_offset("cut", p, -1)
                out[p] = (int(answer.error_code), int(answer.offset))
            return out
    except OSError:
        return None



def test_a_killed_host_is_healed_in_seconds_after_a_rebalance_gave_it_work(
        cut_off_cluster: dict[str, Any], test_host: TestHost) -> None:
    ray_cluster: RayTestCluster = cut_off_cluster["ray"]
    bootstrap = cut_off_cluster["bootstrap"]
    create_topic(bootstrap, "killed", PARTITIONS)

    def host_shard() -> dict[str, Any] | None:
        info = json.loads(kafscale("cluster", "info", "--ray-address", ray_cluster.address, "-o", "json").stdout)
        return next((s for n in info["nodes"] for s in n["shards"] if s["node_ip"] == test_host.node_ip), None)

    assert wait_until(lambda: (s := host_shard()) is not None and s["live"], 60), "the test host's shard is not back"
    moved = kafscale("cluster", "rebalance", "--ray-address", ray_cluster.address, "-o", "json")
    assert moved.returncode == 0, moved.stderr
    shard = host_shard()
    assert shard is not None
    lost = sorted(int(p.rsplit("-", 1)[1]) for p in shard["partitions"] if p.startswith("killed-"))
    assert lost, f"the rebalance gave the test host no partition of the topic: {shard}"

    traffic = Traffic(bootstrap, "killed", PARTITIONS).start()
    time.sleep(3)
    killed_at = time.monotonic()
    ray_cluster.kill_nodes_in(test_host)
    healing = traffic.healed(killed_at, settle=10)
    traffic.stop()
    print(f"served again after the host's kill: { {p: round(t, 2) for p, t in healing.items()} } s (on it: {lost})")
    assert all(healing[p] <= HEAL_BOUND_S for p in range(PARTITIONS)), healing
    assert all(healing[p] > 0 for p in lost), "the killed host's partitions never paused"
    assert_exactly_once(traffic, read_all(bootstrap, "killed", PARTITIONS, traffic.ends()))
