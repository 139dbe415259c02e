"""Real clients driving the test clusters, shared by the tests/cluster modules: a checked idempotent producer
(Traffic), a consumer group member, the read-back and exactly-once checks, and the `kafscale` CLI.

Every Traffic, GroupMember and load process registers itself; tests/cluster/conftest.py stops the ones a test
left running (a failed assertion skips the test's own stop), so no client of one test outlives it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafscale.testing.ray_cluster import RayTestCluster

# The specification's "a node's death healed in seconds" is held to its 10 s target by the cluster benchmark on a
# quiet machine. In the suite the bound only tells slow from never: one heal took 10.6 s at a load of 9.8 on 2 cores.
HEAL_BOUND_S = 20

_running: list[Any] = []  # started and not yet stopped: anything with close()


def close_leftovers() -> None:
    """Stop what a test started and did not stop."""
    while _running:
        _running.pop().close()


def start_load(bootstrap: str, topic: str, partitions: int, seconds: int, mb_s: float) -> subprocess.Popen[bytes]:
    """kafscale.testing.load_producer in its own process; closing its stdin stops it (it prints the acked count)."""
    proc = subprocess.Popen([sys.executable, "-m", "kafscale.testing.load_producer", bootstrap, topic,
                             str(partitions), str(seconds), str(mb_s)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    _running.append(_Process(proc))
    return proc


class _Process:
    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def kafscale(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kafscale.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def layout(ray_cluster: RayTestCluster) -> dict[str, Any]:
    proc = kafscale("cluster", "info", "--ray-address", ray_cluster.address, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("{"), f"not the layout: {proc.stdout!r}; stderr: {proc.stderr[-2000:]}"
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
        _running.append(self)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sending; every record sent must be acknowledged."""
        self._halt()
        assert self.producer.flush(120) == 0, "records never acknowledged"

    def close(self) -> None:
        """Stop sending and drop what is unacknowledged (a failed test's leftover)."""
        self._halt()
        self.producer.purge()
        self.producer.flush(1)

    def _halt(self) -> None:
        self._stop.set()
        self._thread.join(30)
        with contextlib.suppress(ValueError):
            _running.remove(self)

    def ends(self) -> dict[int, int]:
        """Per partition: the offset after its last acknowledged record."""
        ends: dict[int, int] = {}
        for p, o in self.acked:
            ends[p] = max(ends.get(p, 0), o + 1)
        return ends

    def healed(self, since: float, settle: float, gap: float = 0.5, timeout: float = 60) -> dict[int, float]:
        """`served_again(since)` once every partition is being served: at least `settle` seconds after `since`,
        waiting on (up to `timeout`) while some partition's pause is still going on. Stopping the traffic at a fixed
        time instead could not tell a slow heal from none."""
        deadline = since + timeout
        time.sleep(max(0.0, since + settle - time.monotonic()))
        while time.monotonic() < deadline:
            now = time.monotonic()
            if all(times and now - times[-1] <= gap for times in self.ack_times.values()):
                break
            time.sleep(0.05)
        return self.served_again(since, gap)

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

    def start(self) -> GroupMember:
        _running.append(self)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Leave the group (the thread closes the consumer)."""
        self._stop.set()
        self._thread.join(30)
        with contextlib.suppress(ValueError):
            _running.remove(self)

    close = stop


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets, asked by a consumer of the group that does not join it. Not through
    AdminClient.list_consumer_group_offsets: librdkafka's admin client crashes the process when the answer
    is NOT_COORDINATOR (librdkafka#5040), which a coordinator's move may give; a consumer handles it."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in found if tp.offset >= 0}


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
