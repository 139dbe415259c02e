"""`kafscale serve` end to end: shards on Ray, clean stop, kill -9 durability, forwarding."""

from __future__ import annotations

import os
import random
import re
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

from kafscale.actors.heap import SERVING_GC_THRESHOLDS
from kafscale.actors.local_head import LocalRayHead
from kafscale.protocol.errors import ErrorCode
from kafscale.testing.etcd_server import EtcdServer
from kafscale.testing.ports import free_port
from kafscale.testing.s3_servers import SeaweedS3Server, unique_bucket_name
from kafscale.testing.serve_process import START_TIMEOUT_S, ServeProcess
from tests.integration.conftest import KafkaWire, wait_until
from tests.integration.test_broker_errors import batch, read_all, rows

TOPIC_PARTITIONS = 4


@pytest.fixture(params=["embedded", "cloud"])
def store_args(request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """`kafscale serve` flags for the embedded stores (none) or a fresh etcd prefix and S3 bucket."""
    if request.param == "embedded":
        yield []
        return
    etcd: EtcdServer = request.getfixturevalue("etcd_server")
    s3: SeaweedS3Server = request.getfixturevalue("seaweed_server")
    bucket = unique_bucket_name("serve")
    yield ["--etcd-endpoints", etcd.endpoint, "--etcd-prefix", f"/serve-{uuid.uuid4().hex[:12]}/",
           "--s3-endpoint", s3.endpoint_url, "--s3-bucket", bucket, "--s3-region", s3.region,
           "--s3-access-key", s3.access_key, "--s3-secret-key", s3.secret_key]
    s3.delete_bucket(bucket)


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def _consume_all(bootstrap: str, topic: str, partitions: int, expect_at_least: int,
                 timeout: float = 60) -> dict[int, list[tuple[int, bytes]]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "verify", "enable.auto.commit": False,
                         "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
    eof: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(msg.partition())
                    total = sum(len(v) for v in out.values())
                    if len(eof) == partitions and total >= expect_at_least:
                        break
                continue
            eof.discard(msg.partition())
            out[msg.partition()].append((msg.offset(), msg.value()))
    finally:
        consumer.close()
    return out


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--log-level", "LOUD", "kafscale: log_level: expected one of DEBUG, INFO, WARNING, ERROR, CRITICAL, got 'LOUD'"),
    ("--metrics-listen", "localhost", "kafscale: metrics_listen: expected HOST:PORT or '' (off), got 'localhost'"),
    ("--shard-ports", "9092", "kafscale: shard_ports: 1 ports given for 2 shards per node"),
])
def test_serve_refuses_a_bad_setting_before_starting(tmp_path: Path, flag: str, value: str, message: str) -> None:
    data = tmp_path / "data"
    proc = subprocess.run([sys.executable, "-m", "kafscale.cli", "serve", "--shards", "2", "--data-dir", str(data),
                           flag, value], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == message
    assert not data.exists()  # nothing started, nothing written


def test_serve_produces_consumes_and_stops_cleanly(tmp_path: Path) -> None:
    """acks=1 records still buffered at SIGTERM are flushed by the clean stop and survive a restart."""
    serve = ServeProcess(tmp_path / "data", shards=2, extra_args=["--flush-interval-ms", "2000"])
    with serve:
        _create_topic(serve.bootstrap, "clean", TOPIC_PARTITIONS)
        producer = Producer({"bootstrap.servers": serve.bootstrap, "acks": 1, "linger.ms": 5})
        for i in range(2000):
            producer.produce("clean", key=str(i).encode(), value=f"value-{i}".encode())
        assert producer.flush(30) == 0
        code = serve.terminate()
        assert code == 0
        assert "stopped" in serve.log_text()
        serve.start()
        got = _consume_all(serve.bootstrap, "clean", TOPIC_PARTITIONS, 2000)
    values = sorted(v for records in got.values() for _, v in records)
    assert values == sorted(f"value-{i}".encode() for i in range(2000))
    for records in got.values():
        assert [o for o, _ in records] == list(range(len(records)))


def test_serve_serves_the_console_beside_the_controller(tmp_path: Path) -> None:
    """`kafscale serve` serves the console (docs/console.md): the login of the two variables gets in, and the
    overview shows the shards the controller runs."""
    import requests

    login = {"KAFSCALE_UI_USERNAME": "ops", "KAFSCALE_UI_PASSWORD": "s3cret-enough"}
    with ServeProcess(tmp_path / "data", shards=2, env=login) as serve:
        url = serve.console_url
        assert url.startswith("http://127.0.0.1:")
        s = requests.Session()
        assert s.post(url + "api/login", json={"username": "ops", "password": "wrong"}, timeout=30).status_code == 401
        r = s.post(url + "api/login", json={"username": "ops", "password": "s3cret-enough"}, timeout=30)
        assert r.status_code == 200, r.text
        s.headers["X-CSRF-Token"] = r.json()["csrf"]
        # A shard busy past the overview's wait is shown without its own report: ask until both have answered.
        overview = wait_until(lambda: (o := s.get(url + "api/overview", timeout=30).json())
                              and set(o["shards"]) == {"0", "1"} and o, timeout=60, what="both shards' reports")
        shards = sorted((sh["id"], sh["port"], sh["live"]) for n in overview["nodes"] for sh in n["shards"])
        assert shards == [(0, serve.ports[0], True), (1, serve.ports[1], True)]
        assert overview["controller"]["pid"] > 0 and overview["metadata_store"] == "ok"
        assert {"busy", "bytes_in_per_s", "s3"} <= set(overview["shards"]["0"])
        assert re.fullmatch("[0-9a-f]{32}", overview["shards"]["0"]["actor_id"])  # the page links the actor's page
        _create_topic(serve.bootstrap, "seen-by-the-console", 2)
        topics = s.get(url + "api/topics", timeout=30).json()
        assert {"name": "seen-by-the-console", "partitions": 2, "records": 0, "internal": False} in topics
        producer = Producer({"bootstrap.servers": serve.bootstrap})
        for _ in range(10):
            producer.produce("seen-by-the-console", value=b"x" * 100, partition=0)
        assert producer.flush(30) == 0
        # Sizes come from each shard's log directory (DescribeLogDirs), through the controller.
        sizes = [p["size"] for p in s.get(url + "api/topics/seen-by-the-console", timeout=30).json()["partitions"]]
        assert sizes[0] > 1000 and sizes[1] == 0, sizes
        # A virtual topic's page shows its physical partitions (which only the controller knows).
        admin = AdminClient({"bootstrap.servers": serve.bootstrap})
        admin.create_topics([NewTopic("virtual-seen", 2, config={"kafscale.virtual.partitions": "6"})])[
            "virtual-seen"].result(30)
        detail = s.get(url + "api/topics/virtual-seen", timeout=30).json()
        assert (len(detail["partitions"]), detail["physical"]) == (6, 2), detail

        def leader() -> int:
            layout = s.get(url + "api/overview", timeout=30).json()["nodes"]
            return next(sh["id"] for n in layout for sh in n["shards"] if "seen-by-the-console-0" in sh["partitions"])

        source = leader()
        moved = s.post(url + "api/placement/move", json={"topic": "seen-by-the-console", "partition": 0,
                                                        "shard": 1 - source}, timeout=60)
        assert moved.status_code == 200, moved.text
        assert moved.json()["moved"] and (moved.json()["source"], moved.json()["target"]) == (source, 1 - source)
        assert leader() == 1 - source
        refused = s.post(url + "api/placement/move", json={"topic": "seen-by-the-console", "partition": 0,
                                                          "shard": 7}, timeout=60)
        assert refused.status_code == 400 and refused.json() == {"error": "shard 7 is not live"}


@pytest.mark.timeout(START_TIMEOUT_S + 300)  # a start of `kafscale serve` may take its whole wait on a busy machine
def test_shards_run_on_uvloop_at_nice_0_with_their_startup_heap_out_of_the_gc(tmp_path: Path) -> None:
    """The process settings the broker's speed rests on (docs/performance.md, "Measured facts behind the
    design"): Ray runs the shard's event loop on uvloop, the objects loaded at startup are frozen out of the
    cycle collector, and the collector runs with the serving thresholds. Any one silently lost (a Ray upgrade,
    a missing wheel) costs 10-40 % of throughput."""
    with ServeProcess(tmp_path / "data", shards=1) as serve:
        match = re.search(r"shard 0 listening on \S+ \(.*, (\w+) event loop, GC skips (\d+) startup objects, "
                          r"thresholds \[(\d+), (\d+), (\d+)\]\)", serve.log_text())
        assert match, f"no shard line in the serve log: {serve.log_text()[-2000:]}"
        assert match.group(1) == "uvloop"
        assert int(match.group(2)) > 10_000, "the startup heap was not frozen"
        assert int(match.group(3)) == SERVING_GC_THRESHOLDS[0], "the serving GC thresholds were not set"
        # Not Ray's nice 15 for workers: any ordinary process on the machine would take the CPU from the shard.
        pid = int(re.search(r"shard 0 listening on .*, pid (\d+),", serve.log_text()).group(1))  # type: ignore[union-attr]
        assert os.getpriority(os.PRIO_PROCESS, pid) == 0


@pytest.mark.timeout(2 * START_TIMEOUT_S + 300)  # two starts of `kafscale serve`, each may take its whole wait
def test_acknowledged_records_survive_kill_9(tmp_path: Path, store_args: list[str]) -> None:
    """Every acks=all acknowledged record is present exactly once after kill -9 and restart;
    no offset that was acknowledged is reused for other data. The metadata history is compacted every second
    throughout, to a second back (docs/operations.md): watches that lag are sent to read their state again."""
    compaction = ["--metadata-compaction-interval-s", "1", "--metadata-history-s", "1"]
    serve = ServeProcess(tmp_path / "data", shards=2, extra_args=store_args + compaction)
    acked: dict[tuple[int, int], bytes] = {}
    stop = threading.Event()
    serve.start()
    try:
        _create_topic(serve.bootstrap, "durable", TOPIC_PARTITIONS)

        def produce() -> None:
            producer = Producer({"bootstrap.servers": serve.bootstrap, "acks": "all", "linger.ms": 2,
                                 "message.timeout.ms": 5000, "enable.idempotence": False, "retries": 0})

            def on_delivery(err: KafkaError | None, msg: object) -> None:
                if err is None:
                    acked[(msg.partition(), msg.offset())] = msg.value()  # type: ignore[attr-defined]

            i = 0
            while not stop.is_set():
                try:
                    producer.produce("durable", value=f"r{i}".encode(), on_delivery=on_delivery)
                    i += 1
                except BufferError:
                    pass
                producer.poll(0.001 if i % 100 else 0.01)
            producer.purge()  # the broker is gone by now (stop is set after the kill): nothing more is acked
            producer.flush(6)

        thread = threading.Thread(target=produce)
        thread.start()
        deadline = time.monotonic() + 30
        while len(acked) < 500 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(random.uniform(0.2, 1.5))
        serve.kill()
        stop.set()
        thread.join(30)
        assert len(acked) >= 500, "producer made too little progress before the kill"
        restarted_at = len(serve.log_text())
        serve.start()
        got = _consume_all(serve.bootstrap, "durable", TOPIC_PARTITIONS, len(acked))
        # The killed run's registrations outlive it by a lease (the store renews leases when it restarts, as
        # etcd does): the new controller must not take them for shards of its own that died.
        assert "healed" not in serve.log_text()[restarted_at:], "the restart moved partitions as after a failure"
        # After the restart, new writes must not reuse any offset that was served before.
        producer = Producer({"bootstrap.servers": serve.bootstrap, "acks": "all"})
        for p in range(TOPIC_PARTITIONS):
            producer.produce("durable", value=b"after-restart", partition=p)
        assert producer.flush(30) == 0
        after = _consume_all(serve.bootstrap, "durable", TOPIC_PARTITIONS, len(acked) + TOPIC_PARTITIONS)
        assert "metadata store compacted to revision" in serve.log_text()[restarted_at:]
    finally:
        stop.set()
        serve.kill()
    stored = {(p, o): v for p, records in got.items() for o, v in records}
    for key, value in acked.items():
        assert stored.get(key) == value, f"acknowledged record at partition/offset {key} lost or changed"
    all_values = [v for records in got.values() for _, v in records]
    assert len(all_values) == len(set(all_values)), "a record is stored twice"
    for p, records in after.items():
        offsets = [o for o, _ in records]
        assert offsets == list(range(len(offsets))), f"offsets of partition {p} not contiguous"
        before = dict(got[p])
        for o, v in records:
            if o in before:
                assert before[o] == v, f"offset {o} of partition {p} was reused"


def test_requests_to_a_shard_that_does_not_own_the_partition_are_forwarded(tmp_path: Path,
                                                                          store_args: list[str]) -> None:
    """One address is enough: produce, fetch and list offsets sent to shard 0 for partitions that
    shard 1 owns are forwarded through Ray and answered as the owner would."""
    with ServeProcess(tmp_path / "data", shards=2, extra_args=store_args) as serve:
        _create_topic(serve.bootstrap, "forwarded", TOPIC_PARTITIONS)
        with KafkaWire(serve.ports[0]) as wire:
            leaders = {p.partition_index: int(p.leader_id) for p in wire.metadata(["forwarded"]).topics[0].partitions}
            assert set(leaders.values()) == {0, 1}, f"placement did not use both shards: {leaders}"
            for p in range(TOPIC_PARTITIONS):
                for round_ in range(2):
                    answer = wire.produce("forwarded", p, batch(rows(f"p{p}r{round_}", 5)))
                    assert answer.error_code == ErrorCode.none, (p, answer.error_code)
                    assert answer.base_offset == 5 * round_
            for p in range(TOPIC_PARTITIONS):
                got = read_all(wire, "forwarded", p)
                assert [o for o, _ in got] == list(range(10))
                assert [r[0] for _, r in got] == [f"p{p}r{i // 5}-{i % 5}".encode() for i in range(10)]
                latest = wire.list_offset("forwarded", p, -1)
                assert (latest.error_code, latest.offset) == (ErrorCode.none, 10)
                by_time = wire.list_offset("forwarded", p, 1_700_000_000_002)
                assert (by_time.error_code, by_time.offset) == (ErrorCode.none, 2)
            assert wire.fetch("forwarded", 1, 11).error_code == ErrorCode.offset_out_of_range
            # A long poll on a forwarded partition waits for data produced through the owner's own shard.
            owner_port = serve.ports[leaders[1]]
            corr_start = time.monotonic()
            late: list[Any] = []

            def produce_late() -> None:
                time.sleep(0.5)
                with KafkaWire(owner_port) as direct:
                    late.append(direct.produce("forwarded", 1, batch(rows("late", 1))))

            producer = threading.Thread(target=produce_late)
            producer.start()
            waited = wire.fetch("forwarded", 1, 10, max_wait_ms=10_000, min_bytes=1)
            producer.join(30)
            assert late and late[0].error_code == ErrorCode.none
            assert waited.error_code == ErrorCode.none and waited.records
            assert time.monotonic() - corr_start < 9, "the forwarded long poll did not wake on new data"


def test_a_crashed_shard_is_restarted_and_clients_carry_on(tmp_path: Path) -> None:
    """kill -9 of one shard's worker process: its lease lapses, the controller moves its partitions to the
    live shard (Ray restarts the process meanwhile), producers retry, and every acknowledged record is there
    exactly once."""
    serve = ServeProcess(tmp_path / "data", shards=2)
    acked: dict[tuple[int, int], bytes] = {}
    with serve:
        _create_topic(serve.bootstrap, "crash", TOPIC_PARTITIONS)
        match = re.search(r"shard 1 listening on \S+ \(Ray actor kafscale-shard-1, pid (\d+)[,)]", serve.log_text())
        assert match, "serve did not log shard 1's pid"
        producer = Producer({"bootstrap.servers": serve.bootstrap, "acks": "all", "linger.ms": 2,
                             "enable.idempotence": True, "message.timeout.ms": 90_000})

        def on_delivery(err: KafkaError | None, msg: Any) -> None:
            assert err is None, err
            acked[(msg.partition(), msg.offset())] = msg.value()

        for i in range(4000):
            if i == 1000:
                assert producer.flush(30) == 0
                os.kill(int(match.group(1)), signal.SIGKILL)
            producer.produce("crash", value=f"r{i}".encode(), partition=i % TOPIC_PARTITIONS,
                             on_delivery=on_delivery)
            producer.poll(0)
        assert producer.flush(90) == 0
        assert len(acked) == 4000
        assert "healed" in serve.log_text()
        got = _consume_all(serve.bootstrap, "crash", TOPIC_PARTITIONS, 4000)
    stored = {(p, o): v for p, records in got.items() for o, v in records}
    assert stored == acked
    for p, records in got.items():
        assert [o for o, _ in records] == list(range(len(records))), f"partition {p} has a gap"


def test_serve_joins_a_running_ray_cluster_and_leaves_it_running(tmp_path: Path) -> None:
    """--ray-address: the broker runs its actors on an existing cluster and, when stopped, removes
    them (a second broker can take the same names) without stopping the cluster itself."""
    head = LocalRayHead(num_cpus=2)
    address = head.start()
    try:
        for round_ in range(2):
            with ServeProcess(tmp_path / "data", shards=2, extra_args=["--ray-address", address]) as serve:
                assert "started a local Ray head" not in serve.log_text()
                producer = Producer({"bootstrap.servers": serve.bootstrap, "acks": "all"})
                for i in range(100):
                    producer.produce("joined", value=f"{round_}-{i}".encode(), partition=0)
                assert producer.flush(30) == 0
                got = _consume_all(serve.bootstrap, "joined", 1, 100 * (round_ + 1))
                assert [v for _, v in got[0]][-100:] == [f"{round_}-{i}".encode() for i in range(100)]
            os.killpg(head.pgid, 0)  # the cluster outlives the broker: raises if its processes are gone
    finally:
        head.stop()


def test_a_shard_whose_port_is_taken_moves_to_another_port_slot(tmp_path: Path) -> None:
    """Shard 1's port is held by another socket before the broker starts: the controller moves shard 1 to the next
    free port of --shard-ports (and says why), it serves there, and clients reach both shards."""
    ports = [free_port() for _ in range(3)]
    serve = ServeProcess(tmp_path / "data", shards=2, ports=ports)
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", ports[1]))
    squatter.listen()
    try:
        with serve:
            try:
                moved = (rf"shard 1 cannot start: the PLAINTEXT listener's port 127.0.0.1:{ports[1]} is in use; "
                         rf"it moves to port slot 2 \(port {ports[2]}\)")
                assert re.search(moved, serve.log_text()), serve.log_text()[-3000:]
            finally:
                squatter.close()  # the broker's stop waits for all of its ports to be free
            admin = AdminClient({"bootstrap.servers": serve.bootstrap})
            brokers = {b.id: b.port for b in admin.list_topics(timeout=30).brokers.values()}
            assert brokers == {0: ports[0], 1: ports[2]}
            _create_topic(serve.bootstrap, "moved-port", TOPIC_PARTITIONS)
            producer = Producer({"bootstrap.servers": serve.bootstrap, "acks": "all"})
            for i in range(40):
                producer.produce("moved-port", value=f"r{i}".encode(), partition=i % TOPIC_PARTITIONS)
            assert producer.flush(30) == 0
            leaders = {p.leader for p in admin.list_topics("moved-port", timeout=30).topics["moved-port"]
                       .partitions.values()}
            assert leaders == {0, 1}, "both shards lead partitions"
            got = _consume_all(serve.bootstrap, "moved-port", TOPIC_PARTITIONS, 40)
            assert sorted(v for records in got.values() for _, v in records) == sorted(f"r{i}".encode()
                                                                                      for i in range(40))
    finally:
        squatter.close()
