"""The broker on a 3-node Ray cluster (every node on 127.0.0.1), with etcd and S3, driven by real clients.

One Ray cluster serves the whole module (tests/cluster/conftest.py); each test runs its own
`kafscale serve --ray-address` on it with shards on every node, and the node-loss test adds a node back.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from kafscale.cluster.placement import group_slot
from kafscale.testing.etcd_server import EtcdServer
from kafscale.testing.ports import free_port
from kafscale.testing.proxy import running_proxy
from kafscale.testing.ray_cluster import RayTestCluster, wait_until
from kafscale.testing.s3_servers import SeaweedS3Server, unique_bucket_name
from kafscale.testing.serve_process import ServeProcess
from tests.cluster.clients import (
    HEAL_BOUND_S,
    GroupMember,
    Traffic,
    assert_exactly_once,
    committed,
    create_topic,
    kafscale,
    layout,
    listening,
    read_all,
    shards_by_node,
)
from tests.cluster.conftest import NODES
from tests.integration.test_transactions_crashes import settle_and_check, summary
from tests.integration.txn_workload import ABORTED, COMMITTED, TxnWriter
from tests.integration.txn_workload import Reader as TxnReader
from tests.integration.virtual_workload import produce_keyed


@pytest.fixture
def cloud_args(etcd_server: EtcdServer, seaweed_server: SeaweedS3Server) -> Iterator[list[str]]:
    bucket = unique_bucket_name("cluster")
    s3 = seaweed_server
    yield ["--etcd-endpoints", etcd_server.endpoint, "--etcd-prefix", f"/cluster-{uuid.uuid4().hex[:12]}/",
           "--s3-endpoint", s3.endpoint_url, "--s3-bucket", bucket, "--s3-region", s3.region,
           "--s3-access-key", s3.access_key, "--s3-secret-key", s3.secret_key]
    s3.delete_bucket(bucket)


@pytest.fixture
def cluster_serve(tmp_path: Path, ray_cluster: RayTestCluster, cloud_args: list[str]) -> Iterator[ServeProcess]:
    """Shards on every node (one per node), all on 127.0.0.1: each takes the next port slot."""
    serve = ServeProcess(tmp_path / "data", shards=NODES, ports=[free_port() for _ in range(NODES + 1)],
                         extra_args=[*cloud_args, "--ray-address", ray_cluster.address, "--shards-per-node", "1",
                                     "--flush-interval-ms", "20"])
    with serve:
        yield serve


def test_shards_on_every_node_serve_clients_at_their_own_addresses(cluster_serve: ServeProcess,
                                                                   ray_cluster: RayTestCluster) -> None:
    create_topic(cluster_serve.bootstrap_all, "spread", 6)
    admin = AdminClient({"bootstrap.servers": cluster_serve.bootstrap_all})
    md = admin.list_topics("spread", timeout=30)
    brokers = {b.id: (b.host, b.port) for b in md.brokers.values()}
    assert len(brokers) == NODES
    # Nodes share 127.0.0.1 here, so each shard took the next port slot of that address.
    assert sorted(port for _, port in brokers.values()) == sorted(cluster_serve.ports[:NODES])
    assert {p.leader for p in md.topics["spread"].partitions.values()} == set(brokers)

    info = layout(ray_cluster)
    nodes = shards_by_node(info)
    assert set(nodes) == set(ray_cluster.node_ids()), "not every node runs a shard"
    assert all(len(shards) == 1 and shards[0]["live"] for shards in nodes.values())
    assert sorted(len(s["partitions"]) for shards in nodes.values() for s in shards) == [2, 2, 2]

    traffic = Traffic(cluster_serve.bootstrap_all, "spread", 6).start()
    time.sleep(2)
    traffic.stop()
    assert_exactly_once(traffic, read_all(cluster_serve.bootstrap_all, "spread", 6, traffic.ends()))
    assert {p for p, _ in traffic.acked} == set(range(6))


def test_a_virtual_topic_spreads_and_moves_by_physical_partition(cluster_serve: ServeProcess,
                                                                 ray_cluster: RayTestCluster) -> None:
    """12 virtual partitions over 3: each physical partition's virtual ones are led by one shard, the three
    spread over the nodes, and a move of any virtual partition moves its physical partition whole, while an
    idempotent producer writes to every virtual partition: nothing lost, nothing twice."""
    admin = AdminClient({"bootstrap.servers": cluster_serve.bootstrap_all})
    admin.create_topics([NewTopic("lanes", 3, config={"kafscale.virtual.partitions": "12"})])["lanes"].result(30)
    md = admin.list_topics("lanes", timeout=30)
    leaders = {p: m.leader for p, m in md.topics["lanes"].partitions.items()}
    assert sorted(leaders) == list(range(12))
    assert all(leaders[v] == leaders[v % 3] for v in range(12)), "a physical partition's lanes on one shard"
    assert len({leaders[p] for p in range(3)}) == NODES, "the physical partitions spread over the nodes"
    traffic = Traffic(cluster_serve.bootstrap_all, "lanes", 12).start()
    time.sleep(2)
    info = layout(ray_cluster)
    shards = sorted(s["id"] for n in info["nodes"] for s in n["shards"])
    current = next(s["id"] for n in info["nodes"] for s in n["shards"] if "lanes-1" in s["partitions"])
    target = shards[(shards.index(current) + 1) % len(shards)]
    proc = kafscale("partition", "move", "lanes", "7", "--to", str(target), "--ray-address", ray_cluster.address,
                    "-o", "json")  # virtual partition 7 lives in physical partition 1
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["moved"]
    time.sleep(2)
    traffic.stop()
    after = {p for n in layout(ray_cluster)["nodes"] for s in n["shards"] if s["id"] == target
             for p in s["partitions"]}
    assert "lanes-1" in after
    moved = AdminClient({"bootstrap.servers": cluster_serve.bootstrap_all}).list_topics("lanes", timeout=30)
    assert len({moved.topics["lanes"].partitions[v].leader for v in (1, 4, 7, 10)}) == 1, "its lanes moved together"
    assert_exactly_once(traffic, read_all(cluster_serve.bootstrap_all, "lanes", 12, traffic.ends()))
    assert {p for p, _ in traffic.acked} == set(range(12))


def test_the_proxy_in_front_of_a_three_broker_cluster(cluster_serve: ServeProcess) -> None:
    """The proxy sends each physical partition's requests to its own leader among three upstream brokers, and a
    group's to its coordinator: a keyed workload over 12 virtual partitions of 3 physical ones, consumed by a group
    of two through the proxy: every record, each at the partition and offset its producer was told, and nothing
    else."""
    mapping = "mapping:\n  topics:\n    proxied:\n      virtual_partitions: 12\n      physical_partitions: 3\n"
    with running_proxy(cluster_serve.bootstrap_all.split(",")[0], mapping) as bootstrap:
        create_topic(bootstrap, "proxied", 12)
        upstream = AdminClient({"bootstrap.servers": cluster_serve.bootstrap_all}).list_topics("proxied", timeout=30)
        assert len({p.leader for p in upstream.topics["proxied"].partitions.values()}) == NODES
        members = [GroupMember(bootstrap, "proxied", "proxied-group") for _ in range(2)]
        for m in members:
            m.start()
        sent = produce_keyed(bootstrap, "proxied", 0, 600)
        assert wait_until(lambda: set().union(*(m.seen for m in members)) >= set(sent), 60), \
            "the group did not consume every record through the proxy"
        for m in members:
            m.stop()
        assert {p for p, _ in sent.values()} == set(range(12))
        received = {(p, o) for m in members for _, p, o in m.received}
        assert received == set(sent.values()), "a record at a place its producer was not told, or one missing"


def test_planned_moves_of_busy_partitions_and_a_group_lose_and_duplicate_nothing(
        cluster_serve: ServeProcess, ray_cluster: RayTestCluster) -> None:
    create_topic(cluster_serve.bootstrap_all, "moving", 4)
    traffic = Traffic(cluster_serve.bootstrap_all, "moving", 4).start()
    members = [GroupMember(cluster_serve.bootstrap_all, "moving", "moving-group") for _ in range(2)]
    for m in members:
        m.start()
    time.sleep(2)
    info = layout(ray_cluster)
    shards = sorted(s["id"] for n in info["nodes"] for s in n["shards"])
    leaders = {p: s["id"] for n in info["nodes"] for s in n["shards"] for p in s["partitions"]}
    started = time.monotonic()
    for p in range(4):
        current = leaders[f"moving-{p}"]
        target = shards[(shards.index(current) + 1) % len(shards)]
        proc = kafscale("partition", "move", "moving", str(p), "--to", str(target), "--ray-address",
                        ray_cluster.address, "-o", "json")
        assert proc.returncode == 0, proc.stderr
        moved = json.loads(proc.stdout)
        assert (moved["from"], moved["to"], moved["moved"]) == (current, target, True)
    # Drain one node: its shard's partitions and group slots go to the others.
    victim = next(n for n in info["nodes"] if n["node_id"] != info["controller"]["node_id"])
    proc = kafscale("cluster", "drain", "--node", victim["node_id"], "--ray-address", ray_cluster.address)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    time.sleep(2)
    ended = time.monotonic()
    traffic.stop()
    after = layout(ray_cluster)
    drained = next(s for n in after["nodes"] if n["node_id"] == victim["node_id"] for s in n["shards"])
    assert drained["partitions"] == [] and drained["group_slots"] == [] and drained["draining"]
    create_topic(cluster_serve.bootstrap_all, "after-drain", 6)  # new work avoids a drained shard
    assert not any(p.startswith("after-drain-") for n in layout(ray_cluster)["nodes"] for s in n["shards"]
                   if s["id"] == drained["id"] for p in s["partitions"])
    pauses = sorted(traffic.longest_pause(started, ended).values())
    print(f"produce pause per partition during moves: {[round(p, 3) for p in pauses]} s")
    stored = read_all(cluster_serve.bootstrap_all, "moving", 4, traffic.ends())
    assert_exactly_once(traffic, stored)
    # The group's coordinator moved with the drain (every slot left the drained shard): its members go on.
    assert wait_until(lambda: set().union(*(m.seen for m in members)) >= set(stored.values()), 60), \
        "the group did not consume every record across the moves"
    for m in members:
        m.stop()


def test_a_killed_node_is_healed_in_seconds_and_nothing_acknowledged_is_lost(
        cluster_serve: ServeProcess, ray_cluster: RayTestCluster) -> None:
    topic, partitions, group = "healing", 6, "healing-group"
    create_topic(cluster_serve.bootstrap_all, topic, partitions)
    info = layout(ray_cluster)
    victim = next(n for n in info["nodes"] if n["node_id"] != info["controller"]["node_id"]
                  and n["node_id"] != ray_cluster.head_id() and any(s["partitions"] for s in n["shards"]))
    lost = {p for s in victim["shards"] for p in s["partitions"]}

    members = [GroupMember(cluster_serve.bootstrap_all, topic, group) for _ in range(3)]
    traffic = Traffic(cluster_serve.bootstrap_all, topic, partitions).start()
    for m in members:
        m.start()
    # The members have joined and committed on every partition before the kill (a fixed wait was too short on a
    # busy machine: the group had not finished its first rebalance).
    assert wait_until(lambda: len(committed(cluster_serve.bootstrap_all, group, topic, partitions)) == partitions,
                      60), "the group never committed on every partition before the kill"
    before = committed(cluster_serve.bootstrap_all, group, topic, partitions)
    killed_at = time.monotonic()
    ray_cluster.kill_node(victim["node_id"])
    ports = [s["port"] for s in victim["shards"]]
    assert wait_until(lambda: not any(listening(port) for port in ports), 5), "the killed node's shard still listens"
    healing = traffic.healed(killed_at, settle=14)
    traffic.stop()
    print(f"served again after the kill, per partition: { {p: round(t, 2) for p, t in healing.items()} } s"
          f" (partitions on the killed node: {sorted(lost)})")
    assert max(healing.values()) <= HEAL_BOUND_S, healing
    assert all(healing[int(p.rsplit("-", 1)[1])] > 0 for p in lost), "the killed node's partitions never paused"

    stored = read_all(cluster_serve.bootstrap_all, topic, partitions, traffic.ends())
    assert_exactly_once(traffic, stored)
    # The group goes on: its members get every record (from the committed offsets on, not from the start).
    assert wait_until(lambda: set().union(*(m.seen for m in members)) >= set(stored.values()), 60), \
        "the group did not consume every record after the node's loss"
    for m in members:
        m.stop()
    assert before, "the group committed nothing before the kill"
    rewound = [(p, o) for m in members for t, p, o in m.received if t > killed_at and o < before.get(p, 0)]
    assert not rewound, f"members read again from before the group's committed offsets: {rewound[:5]}"
    # A node that joins gets its shard (and the module's later tests get their three nodes back).
    joined = ray_cluster.add_node()
    assert wait_until(lambda: any(s["live"] for s in shards_by_node(layout(ray_cluster)).get(joined, [])), 60), \
        "the new node got no live shard"


def test_the_controller_killed_comes_back_and_the_data_path_never_waits_for_it(
        cluster_serve: ServeProcess, ray_cluster: RayTestCluster) -> None:
    create_topic(cluster_serve.bootstrap_all, "steady", 3)
    before = layout(ray_cluster)["controller"]
    traffic = Traffic(cluster_serve.bootstrap_all, "steady", 3).start()
    time.sleep(2)
    killed_at = time.monotonic()
    os.kill(before["pid"], signal.SIGKILL)
    time.sleep(5)
    ended = time.monotonic()
    traffic.stop()
    assert max(traffic.longest_pause(killed_at, ended).values()) < 2.0, "produce waited for the controller"
    assert wait_until(lambda: layout(ray_cluster)["controller"]["pid"] != before["pid"], 60)
    assert_exactly_once(traffic, read_all(cluster_serve.bootstrap_all, "steady", 3, traffic.ends()))



def test_transactions_through_a_node_death_lose_nothing_committed_and_show_nothing_aborted(
        cluster_serve: ServeProcess, ray_cluster: RayTestCluster) -> None:
    """The Jepsen-style checker (tests/integration/test_transactions_checker.py) on the cluster, through a node's
    death: transactional writers, half of them coordinated by the shard on the node that dies, and read_committed
    readers running through it. The killed shard's partitions and transaction coordinators are healed onto the
    others, which load the transactions' state from the metadata store: prepared ones finish, open ones abort.
    Every reader sees every committed transaction whole, nothing aborted, nothing twice, each writer in order."""
    topic, partitions = "txn-healing", 6
    bootstrap = cluster_serve.bootstrap_all
    create_topic(bootstrap, topic, partitions)
    info = layout(ray_cluster)
    victim = next(n for n in info["nodes"] if n["node_id"] != info["controller"]["node_id"]
                  and n["node_id"] != ray_cluster.head_id() and any(s["partitions"] for s in n["shards"]))
    victim_slots = {slot for s in victim["shards"] for slot in s["group_slots"]}
    assert victim_slots, "the victim's shard coordinates nothing"
    # Transactional ids chosen by their coordinator: two on the victim's shard, two elsewhere.
    ids = (f"cluster-txn-{i}" for i in itertools.count())
    doomed = list(itertools.islice((i for i in ids if group_slot(i) in victim_slots), 2))
    spared = list(itertools.islice((i for i in ids if group_slot(i) not in victim_slots), 2))
    writers = [TxnWriter(bootstrap, topic, partitions, w, seed=3300 + w, txn_id=txn_id, op_timeout_s=30)
               for w, txn_id in enumerate(doomed + spared)]
    readers = [TxnReader(bootstrap, topic, partitions, f"cluster-live-{r}").start() for r in range(2)]
    try:
        for w in writers:
            w.start()
        assert wait_until(lambda: all(w.count(COMMITTED) >= 2 for w in writers), 120), summary(writers)
        before = [w.count(COMMITTED) for w in writers]
        ray_cluster.kill_node(victim["node_id"])
        # Every writer commits again, the doomed ones through their coordinator's new shard.
        assert wait_until(lambda: all(w.count(COMMITTED) >= b + 2 for w, b in zip(writers, before, strict=True)),
                          180), summary(writers)
        owners = {slot: s["id"] for n in layout(ray_cluster)["nodes"] for s in n["shards"] for slot in s["group_slots"]}
        gone = {s["id"] for s in victim["shards"]}
        assert not gone & {owners[group_slot(i)] for i in doomed}, "the doomed ids' coordinator did not move"
        readers.append(TxnReader(bootstrap, topic, partitions, "cluster-late").start())
        results = settle_and_check(bootstrap, topic, partitions, "cluster", writers, readers, 120)
        print(f"\ncluster txn: {summary(writers)}\n  readers: {results}")
        assert sum(w.count(ABORTED) for w in writers) >= 2, "the run aborted too little to check anything"
    finally:
        for w in writers:
            w._stop.set()
        for reader in readers:
            reader._stop.set()
        joined = ray_cluster.add_node()  # the module's later tests get their three nodes back
    assert wait_until(lambda: any(s["live"] for s in shards_by_node(layout(ray_cluster)).get(joined, [])), 60), \
        "the new node got no live shard"
