"""The broker on a 3-node Ray cluster (every node on 127.0.0.1), with etcd and S3, driven by real clients.

One Ray cluster serves the whole module (tests/cluster/conftest.py); each test runs its own
`kafscale serve --ray-address` on it with shards on every node, and the node-loss test adds a node back.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafscale.testing.etcd_server import EtcdServer
from kafscale.testing.ports import free_port
from kafscale.testing.ray_cluster import RayTestCluster, wait_until
from kafscale.testing.s3_servers import SeaweedS3Server, unique_bucket_name
from kafscale.testing.serve_process import ServeProcess
from tests.cluster.conftest import NODES


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


def kafscale(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kafscale.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def layout(ray_cluster: RayTestCluster) -> dict[str, Any]:
    proc = kafscale("cluster", "info", "--ray-address", ray_cluster.address, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def shards_by_node(info: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return {n["node_id"]: n["shards"] for n in info["nodes"]}


class Traffic:
    """An idempotent acks=all producer, flat out over every partition of a topic, in a thread: what was
    acknowledged where, and when."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, **settings: Any) -> None:
        self.topic, self.partitions = topic, partitions
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                                  "linger.ms": 5, "message.timeout.ms": 120_000, "retry.backoff.ms": 50,
                                  "retry.backoff.max.ms": 250, "reconnect.backoff.max.ms": 250,
                                  "topic.metadata.refresh.interval.ms": 1000, **settings})
        self.acked: dict[tuple[int, int], bytes] = {}
        self.ack_times: dict[int, list[float]] = {p: [] for p in range(partitions)}
        self.errors: list[str] = []
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))
            return
        self.acked[(msg.partition(), msg.offset())] = msg.value()
        self.ack_times[msg.partition()].append(time.monotonic())

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.producer.produce(self.topic, value=f"v{self.sent}".encode(), partition=self.sent % self.partitions,
                                      on_delivery=self._delivered)
                self.sent += 1
            except BufferError:
                self.producer.poll(0.05)
            self.producer.poll(0)

    def start(self) -> Traffic:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert self.producer.flush(120) == 0, "records never acknowledged"

    def ends(self) -> dict[int, int]:
        """Per partition: the offset after its last acknowledged record."""
        ends: dict[int, int] = {}
        for p, o in self.acked:
            ends[p] = max(ends.get(p, 0), o + 1)
        return ends

    def served_again(self, since: float, gap: float = 0.5) -> dict[int, float]:
        """Per partition: seconds from `since` to its first acknowledgement after a pause of more than `gap`
        (answers already on their way at `since` do not count as service); 0 if it never paused."""
        out = {}
        for p, times in self.ack_times.items():
            after = [since, *[t for t in times if t >= since]]
            resumed = next((b for a, b in itertools.pairwise(after) if b - a > gap), None)
            out[p] = resumed - since if resumed is not None else (0.0 if len(after) > 1 else float("inf"))
        return out

    def longest_pause(self, start: float, end: float) -> dict[int, float]:
        """Per partition: the longest time without an acknowledgement within [start, end]."""
        out = {}
        for p, times in self.ack_times.items():
            inside = [start, *[t for t in times if start <= t <= end], end]
            out[p] = max(b - a for a, b in itertools.pairwise(inside))
        return out


def read_all(bootstrap: str, topic: str, partitions: int, ends: dict[int, int],
             timeout: float = 240) -> dict[tuple[int, int], bytes]:
    """Every record of the topic up to `ends` (partition -> the offset after its last acknowledged record)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"verify-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: dict[tuple[int, int], bytes] = {}
    reached: dict[int, int] = {p: 0 for p in range(partitions)}
    deadline = time.monotonic() + timeout
    try:
        while any(reached[p] < ends.get(p, 0) for p in range(partitions)):
            assert time.monotonic() < deadline, f"read only {len(out)} records in {timeout:.0f} s; ends {ends}"
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            assert (msg.partition(), msg.offset()) not in out, "an offset was delivered twice"
            out[(msg.partition(), msg.offset())] = msg.value()
            reached[msg.partition()] = msg.offset() + 1
    finally:
        consumer.close()
    return out


def assert_exactly_once(traffic: Traffic, stored: dict[tuple[int, int], bytes]) -> None:
    assert not traffic.errors, traffic.errors[:5]
    assert {k: stored.get(k) for k in traffic.acked} == traffic.acked, "an acknowledged record is missing or moved"
    values = list(stored.values())
    assert len(values) == len(set(values)), "a record is stored twice"


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held: a collected client cancels its requests
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


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
    time.sleep(4)
    admin = AdminClient({"bootstrap.servers": cluster_serve.bootstrap_all})
    committed = admin.list_consumer_group_offsets([_group_request(group, topic, partitions)])[group].result(30)
    before = {tp.partition: tp.offset for tp in committed.topic_partitions if tp.offset >= 0}
    killed_at = time.monotonic()
    ray_cluster.kill_node(victim["node_id"])
    ports = [s["port"] for s in victim["shards"]]
    assert wait_until(lambda: not any(_listening(port) for port in ports), 5), "the killed node's shard still listens"
    time.sleep(14)
    traffic.stop()
    healing = traffic.served_again(killed_at)
    print(f"served again after the kill, per partition: { {p: round(t, 2) for p, t in healing.items()} } s"
          f" (partitions on the killed node: {sorted(lost)})")
    assert max(healing.values()) <= 10, healing
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


class GroupMember:
    """A consumer group member in a thread, committing every 200 ms: what it received, and when."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                                  "enable.auto.commit": True, "auto.commit.interval.ms": 200,
                                  "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                                  "reconnect.backoff.max.ms": 250})
        self.topic = topic
        self.seen: set[bytes] = set()
        self.received: list[tuple[float, int, int]] = []  # (time, partition, offset)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.consumer.subscribe([self.topic])
        while not self._stop.is_set():
            msg = self.consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            self.seen.add(msg.value())
            self.received.append((time.monotonic(), msg.partition(), msg.offset()))
        self.consumer.close()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def _group_request(group: str, topic: str, partitions: int) -> Any:
    from confluent_kafka import ConsumerGroupTopicPartitions

    return ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(partitions)])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
