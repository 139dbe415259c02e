"""Transactions through crashes and moves, on a real `kafscale serve` (2 shards on Ray) with librdkafka clients
(issue 33, "Crashes and moves").

* kill -9 of the whole broker while transactional producers commit and abort: after the restart every committed
  transaction is there whole, no aborted record reaches a read_committed reader, and the two transactions left
  open at the kill end as aborted (one by its producer's successor, one by the coordinator's timeout), so the
  last stable offset moves past them;
* a coordinator killed between PrepareCommit and its markers (the object store stalled so the markers cannot be
  made durable, the broker and the client both killed -9): the restarted coordinator finishes the commit on its
  own, in every partition;
* coordinator and partitions on different shards: commits and aborts; a planned partition move
  (`kafscale partition move`) during an open transaction keeps its last stable offset and the transaction
  commits afterwards; kill -9 of one shard's process with writers running loses no committed transaction.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
from confluent_kafka import Producer

from kafscale.cluster import keys
from kafscale.protocol.errors import ErrorCode
from kafscale.testing.faulty_s3 import FaultyS3Proxy
from kafscale.testing.s3_servers import MotoS3Server, unique_bucket_name
from kafscale.testing.serve_process import ServeProcess
from tests.integration.conftest import LIST_OFFSETS, KafkaWire, build, nested_request
from tests.integration.txn_workload import (
    COMMITTED,
    Reader,
    TxnWriter,
    check,
    close_quietly,
    committed_values,
    create_topic,
    read_once,
    transactional_producer,
)

PARTITIONS = 4
TOPIC = "txn-crash"
DEADLINE_S = 90.0  # generous: the machine runs other suites at the same time


# ----------------------------------------------------------------------------------------------- helpers


def stored_transaction(data_dir: Path, txn_id: str) -> dict | None:
    """The coordinator's record of a transactional id, read straight from the embedded metadata store's SQLite
    file (read only: it works while the broker runs, and after its kill -9 without touching its state)."""
    db = sqlite3.connect(f"file:{data_dir / 'metadata.db'}?mode=ro", uri=True, timeout=10)
    try:
        row = db.execute("SELECT value FROM kv WHERE key = ?", (keys.transaction(txn_id).encode(),)).fetchone()
    finally:
        db.close()
    return None if row is None else dict(msgpack.unpackb(row[0], raw=False))


def offsets(port: int, topic: str, partition: int) -> tuple[int, int]:
    """(high watermark, last stable offset): ListOffsets latest, read_uncommitted and read_committed."""
    got = []
    with KafkaWire(port) as wire:
        for isolation in (0, 1):
            part = nested_request(LIST_OFFSETS, "ListOffsetsPartition", partition_index=partition, timestamp=-1)
            request = build(LIST_OFFSETS, replica_id=-1, isolation_level=isolation, topics=(
                nested_request(LIST_OFFSETS, "ListOffsetsTopic", name=topic, partitions=(part,)),))
            answer = wire.call(request).topics[0].partitions[0]
            assert answer.error_code == ErrorCode.none, answer
            got.append(int(answer.offset))
    return got[0], got[1]


def find_transaction_coordinator(port: int, txn_id: str) -> int:
    from kafscale.protocol.codec import make, request_class

    with KafkaWire(port) as wire:
        answer = wire.call(make(request_class(10, 4), key_type=1, coordinator_keys=(txn_id,)))
    coordinator = answer.coordinators[0]
    assert coordinator.error_code == ErrorCode.none, coordinator
    return int(coordinator.node_id)


def leaders(port: int, topic: str) -> dict[int, int]:
    with KafkaWire(port) as wire:
        return {p.partition_index: int(p.leader_id) for p in wire.metadata([topic]).topics[0].partitions}


def shard_pids(serve: ServeProcess) -> dict[int, int]:
    return {int(s): int(pid) for s, pid in re.findall(r"shard (\d+) listening on \S+ \(Ray actor \S+, pid (\d+)",
                                                       serve.log_text())}


def ray_address(serve: ServeProcess) -> str:
    found = re.findall(r"started a local Ray head at (\S+)", serve.log_text())
    assert found, "serve did not log its Ray head's address"
    return str(found[-1])


def wait_until(what: str, predicate: object, deadline_s: float = DEADLINE_S, every: float = 0.2) -> None:
    deadline = time.monotonic() + deadline_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not within {deadline_s}s: {what}"
        time.sleep(every)


def commit_sentinel(bootstrap: str, topic: str, partitions: int, name: str) -> set[bytes]:
    """One committed transaction with a record in every partition: a read_committed reader that has it everywhere
    has read everything written before it."""
    producer = transactional_producer(bootstrap, f"sentinel-{name}")
    try:
        producer.init_transactions(DEADLINE_S)
        producer.begin_transaction()
        values = {f"sentinel-{name}-{p}".encode() for p in range(partitions)}
        for p in range(partitions):
            producer.produce(topic, value=f"sentinel-{name}-{p}".encode(), partition=p)
        producer.commit_transaction(DEADLINE_S)
        return values
    finally:
        close_quietly(producer)


def settle_and_check(bootstrap: str, topic: str, partitions: int, name: str, writers: list[TxnWriter],
                     readers: list[Reader], deadline_s: float) -> dict[str, dict[str, int]]:
    """The end of a checker run: the writers stopped and their ids settled, a sentinel committed, every live reader
    read up to it and stopped, and what each read checked (`check`). Returns each reader's counts."""
    for w in writers:
        w.stop()
    for w in writers:
        w.settle()
    sentinels = commit_sentinel(bootstrap, topic, partitions, name)
    for reader in readers:
        assert reader.wait_for(sentinels, deadline_s), f"reader {reader.name} did not reach the sentinels"
    time.sleep(1)  # anything that should not be there has had a chance to turn up
    for reader in readers:
        reader.stop()
    return {r.name: check(dict(r.rows), writers, f"reader {r.name}", extra=sentinels) for r in readers}


def open_transaction(bootstrap: str, txn_id: str, topic: str, partitions: list[int], tag: str,
                     **config: object) -> tuple[Producer, set[bytes]]:
    """A producer with a transaction begun, its records in the log (flushed, acks=all), neither committed nor
    aborted."""
    producer = transactional_producer(bootstrap, txn_id, **config)
    producer.init_transactions(DEADLINE_S)
    producer.begin_transaction()
    values = set()
    for p in partitions:
        for i in range(3):
            v = f"{tag}-p{p}-{i}".encode()
            producer.produce(topic, value=v, partition=p)
            values.add(v)
    assert producer.flush(DEADLINE_S) == 0
    return producer, values


def stop_all(writers: list[TxnWriter]) -> None:
    for w in writers:
        w.stop()


def start(serve: ServeProcess, attempts: int = 3) -> ServeProcess:
    """serve.start(), again when Ray's own head did not come up: on a loaded machine `ray start` gives up after a
    fixed 30 s ("The current node timed out during startup"), which says nothing about the broker."""
    for attempt in range(attempts):
        size = serve.log_path.stat().st_size if serve.log_path.exists() else 0
        try:
            return serve.start(timeout=180)
        except RuntimeError:
            if attempt + 1 == attempts or b"ray start failed" not in serve.log_path.read_bytes()[size:]:
                raise
            time.sleep(5)
    raise AssertionError("unreachable")


def summary(writers: list[TxnWriter]) -> str:
    return ", ".join(f"w{w.writer}: " + "/".join(f"{o}={w.count(o)}" for o in
                                                 ("committed", "aborted", "unknown", "not_committed"))
                     for w in writers)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeProcess]:
    process = ServeProcess(tmp_path / "data", shards=2, extra_args=["--flush-interval-ms", "20"])
    try:
        yield process
    finally:
        process.kill()


# ------------------------------------------------------------------------- kill -9 of the whole broker


def test_kill_9_of_the_whole_broker_loses_no_committed_transaction_and_shows_no_aborted_one(
        serve: ServeProcess) -> None:
    start(serve)
    bootstrap = serve.bootstrap_all
    create_topic(bootstrap, TOPIC, PARTITIONS)
    writers = [TxnWriter(bootstrap, TOPIC, PARTITIONS, w, seed=1000 + w) for w in range(3)]
    opened: list[Producer] = []
    try:
        for w in writers:
            w.start()
        wait_until("5 commits before the kill", lambda: sum(w.count(COMMITTED) for w in writers) >= 5)
        # Two transactions open at the kill, records in the log: one is ended by its producer's successor, the
        # other by the coordinator's timeout (4 s; the coordinator looks every 10 s).
        successor_id, timeout_id = f"open-reinit-{os.getpid()}", f"open-timeout-{os.getpid()}"
        a, open_a = open_transaction(bootstrap, successor_id, TOPIC, [0, 1], "open-a")
        b, open_b = open_transaction(bootstrap, timeout_id, TOPIC, [2, 3], "open-b",
                                     **{"transaction.timeout.ms": 4000, "message.timeout.ms": 4000})
        opened += [a, b]
        before = sum(w.count(COMMITTED) for w in writers)
        serve.kill()
        killed_at = len(serve.log_text())
        start(serve)
        # Plain records after the open transactions: a read_committed reader reaches them only once both ended.
        plain = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        for p in range(PARTITIONS):
            plain.produce(TOPIC, value=f"after-restart-{p}".encode(), partition=p)
        assert plain.flush(DEADLINE_S) == 0
        successor = transactional_producer(bootstrap, successor_id)
        successor.init_transactions(DEADLINE_S)  # aborts open-a
        close_quietly(successor)
        wait_until("5 more commits after the restart",
                   lambda: sum(w.count(COMMITTED) for w in writers) >= before + 5, 2 * DEADLINE_S)
        stop_all(writers)
        for w in writers:
            w.settle()
        after_values = {f"after-restart-{p}".encode() for p in range(PARTITIONS)}
        sentinels = commit_sentinel(bootstrap, TOPIC, PARTITIONS, "kill9")
        rows = read_once(bootstrap, TOPIC, PARTITIONS, lambda seen: sentinels | after_values <= seen, DEADLINE_S)
        seen = {v for recs in rows.values() for _, v in recs}
        assert after_values <= seen, "the open transactions still hold the last stable offset back"
        assert not (open_a | open_b) & seen, "a transaction open at the kill became visible"
        counts = check(rows, writers, "reader after kill -9", extra=sentinels | after_values)
        assert "timed out; aborting" in serve.log_text()[killed_at:] and timeout_id in serve.log_text()[killed_at:]
        # The open transactions' records were in the log (read_uncommitted shows them): the aborts hid them.
        everything = read_once(bootstrap, TOPIC, PARTITIONS, lambda s: (open_a | open_b | sentinels) <= s,
                               DEADLINE_S, isolation="read_uncommitted")
        assert (open_a | open_b) <= {v for recs in everything.values() for _, v in recs}
        for p in range(PARTITIONS):
            high, stable = offsets(serve.ports[0], TOPIC, p)
            assert stable == high, f"partition {p}: last stable offset {stable} behind high watermark {high}"
        print(f"kill -9 of the whole broker: {summary(writers)}; reader: {counts}")
        assert sum(w.count(COMMITTED) for w in writers) >= 10 and committed_values(writers) <= seen
    finally:
        for w in writers:
            w._stop.set()
        for producer in opened:
            close_quietly(producer)


# ------------------------------------------------------- a coordinator killed between PrepareCommit and markers

_COMMITTER = textwrap.dedent("""
    import sys
    from confluent_kafka import Producer
    bootstrap, topic, txn_id, partitions = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5})
    producer.init_transactions(60)
    producer.begin_transaction()
    for p in range(partitions):
        for i in range(5):
            producer.produce(topic, value=f"prepared-p{p}-{i}".encode(), partition=p)
    assert producer.flush(60) == 0
    print("flushed", flush=True)
    sys.stdin.readline()
    producer.commit_transaction(300)
    print("committed", flush=True)
""")


@pytest.fixture
def stalling_s3(moto_server: MotoS3Server) -> Iterator[tuple[FaultyS3Proxy, list[str]]]:
    bucket = unique_bucket_name("txn-prepared")
    proxy = FaultyS3Proxy(moto_server.endpoint_url, stall_s=20.0, seed=33)  # over before teardown
    try:
        yield proxy, ["--s3-endpoint", proxy.endpoint_url, "--s3-bucket", bucket, "--s3-region", moto_server.region,
                      "--s3-access-key", moto_server.access_key, "--s3-secret-key", moto_server.secret_key]
    finally:
        proxy.close()


def test_a_coordinator_killed_between_prepare_commit_and_its_markers_finishes_the_commit_after_restart(
        tmp_path: Path, stalling_s3: tuple[FaultyS3Proxy, list[str]]) -> None:
    """The client writes five records to each of four partitions and asks to commit while every S3 request
    stalls: PrepareCommit is durable in the metadata store, the markers cannot be. Broker and client are killed
    -9 (nobody retries EndTxn). After the restart, with S3 well again, the coordinator finds the prepared record
    and writes the markers itself: the record ends CompleteCommit and read_committed readers see all twenty
    records, the last stable offset at the high watermark everywhere."""
    proxy, s3_args = stalling_s3
    data = tmp_path / "data"
    serve = ServeProcess(data, shards=2, extra_args=[*s3_args, "--flush-interval-ms", "20"])
    txn_id = f"prepared-{os.getpid()}"
    client: subprocess.Popen[str] | None = None
    try:
        start(serve)
        create_topic(serve.bootstrap_all, TOPIC, PARTITIONS)
        client = subprocess.Popen([sys.executable, "-c", _COMMITTER, serve.bootstrap_all, TOPIC, txn_id,
                                   str(PARTITIONS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  start_new_session=True)
        assert client.stdout is not None and client.stdin is not None
        assert client.stdout.readline().strip() == "flushed"
        record = stored_transaction(data, txn_id)
        assert record is not None and record["state"] == "Ongoing", record
        assert len(record["partitions"]) == PARTITIONS
        proxy.set_rates(stall=1.0)  # from now on nothing reaches S3 for 20 s
        client.stdin.write("commit\n")
        client.stdin.flush()
        wait_until("PrepareCommit in the store", lambda: (stored_transaction(data, txn_id) or {}).get("state")
                   != "Ongoing", 30, 0.05)
        time.sleep(0.5)  # the markers are appended and their flush is stuck in the stalled upload
        serve.kill()
        os.killpg(client.pid, signal.SIGKILL)
        client.wait(10)
        at_kill = stored_transaction(data, txn_id)
        assert at_kill is not None and at_kill["state"] == "PrepareCommit", at_kill
        proxy.set_rates()
        killed_at = len(serve.log_text())
        start(serve)
        wanted = {f"prepared-p{p}-{i}".encode() for p in range(PARTITIONS) for i in range(5)}
        rows = read_once(serve.bootstrap_all, TOPIC, PARTITIONS, lambda seen: wanted <= seen, DEADLINE_S)
        assert {v for recs in rows.values() for _, v in recs} == wanted
        for p, recs in rows.items():
            assert [v for _, v in recs] == [f"prepared-p{p}-{i}".encode() for i in range(5)]
        wait_until("CompleteCommit in the store",
                   lambda: (stored_transaction(data, txn_id) or {}).get("state") == "CompleteCommit", 30)
        for p in range(PARTITIONS):
            high, stable = offsets(serve.ports[0], TOPIC, p)
            assert stable == high == 6, (p, high, stable)  # five records and the commit marker
        assert "Traceback" not in serve.log_text()[killed_at:]
    finally:
        if client is not None and client.poll() is None:
            os.killpg(client.pid, signal.SIGKILL)
        serve.kill()


# ----------------------------------------------------------------------------- two shards: across, moves, kills


def test_transactions_across_shards_a_planned_move_and_a_killed_shard(serve: ServeProcess) -> None:
    start(serve)
    bootstrap = serve.bootstrap_all
    create_topic(bootstrap, TOPIC, PARTITIONS)
    lead = leaders(serve.ports[0], TOPIC)
    assert set(lead.values()) == {0, 1}, f"placement did not use both shards: {lead}"
    # Transactional ids coordinated by each shard; each transaction writes to partitions of the other shard.
    ids: dict[int, str] = {}
    n = 0
    while len(ids) < 2:
        n += 1
        tid = f"across-{n}"
        ids.setdefault(find_transaction_coordinator(serve.ports[0], tid), tid)
    made: list[Producer] = []
    try:
        # 1. commit and abort with the coordinator on one shard and the partitions on the other
        expected: set[bytes] = set()
        aborted: set[bytes] = set()
        for shard, tid in ids.items():
            others = [p for p, s in lead.items() if s != shard]
            producer = transactional_producer(bootstrap, tid)
            made.append(producer)
            producer.init_transactions(DEADLINE_S)
            for t, commit in enumerate((True, False, True)):
                producer.begin_transaction()
                values = {f"{tid}-t{t}-p{p}".encode() for p in others}
                for p in others:
                    producer.produce(TOPIC, value=f"{tid}-t{t}-p{p}".encode(), partition=p)
                if commit:
                    producer.commit_transaction(DEADLINE_S)
                    expected |= values
                else:
                    assert producer.flush(DEADLINE_S) == 0
                    producer.abort_transaction(DEADLINE_S)
                    aborted |= values
        rows = read_once(bootstrap, TOPIC, PARTITIONS, lambda seen: expected <= seen, DEADLINE_S)
        seen = {v for recs in rows.values() for _, v in recs}
        assert seen == expected, (sorted(expected - seen), sorted(seen & aborted))

        # 2. a planned move of a partition with a transaction open in it
        moving = 0
        source = leaders(serve.ports[0], TOPIC)[moving]
        target = 1 - source
        producer, open_values = open_transaction(bootstrap, f"moving-{os.getpid()}", TOPIC, [moving, 1], "moving")
        made.append(producer)
        plain = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        plain.produce(TOPIC, value=b"plain-during-move", partition=moving)
        assert plain.flush(DEADLINE_S) == 0
        high_before, stable_before = offsets(serve.ports[0], TOPIC, moving)
        assert stable_before < high_before, "the open transaction does not hold the last stable offset"
        proc = subprocess.run([sys.executable, "-m", "kafscale.cli", "partition", "move", TOPIC, str(moving), "--to",
                               str(target), "--ray-address", ray_address(serve), "-o", "json"],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert leaders(serve.ports[0], TOPIC)[moving] == target
        assert offsets(serve.ports[target], TOPIC, moving) == (high_before, stable_before), \
            "the move lost the partition's open transaction (its last stable offset)"
        producer.commit_transaction(DEADLINE_S)
        wanted = expected | open_values | {b"plain-during-move"}
        rows = read_once(bootstrap, TOPIC, PARTITIONS, lambda seen: wanted <= seen, DEADLINE_S)
        assert {v for recs in rows.values() for _, v in recs} == wanted
        high, stable = offsets(serve.ports[target], TOPIC, moving)
        assert stable == high == high_before + 1  # the commit marker

        # 3. kill -9 of one shard's process while transactional writers run: Ray restarts it, the controller heals
        writers = [TxnWriter(bootstrap, TOPIC, PARTITIONS, w, seed=2000 + w) for w in range(2)]
        for w in writers:
            w.start()
        wait_until("3 commits before the shard kill", lambda: sum(w.count(COMMITTED) for w in writers) >= 3)
        before = sum(w.count(COMMITTED) for w in writers)
        victim = 1
        os.kill(shard_pids(serve)[victim], signal.SIGKILL)
        wait_until("5 more commits after the shard kill",
                   lambda: sum(w.count(COMMITTED) for w in writers) >= before + 5, 2 * DEADLINE_S)
        stop_all(writers)
        for w in writers:
            w.settle()
        sentinels = commit_sentinel(bootstrap, TOPIC, PARTITIONS, "shard-kill")
        rows = read_once(bootstrap, TOPIC, PARTITIONS, lambda s: sentinels <= s, DEADLINE_S)
        seen = {v for recs in rows.values() for _, v in recs}
        assert wanted <= seen and not seen & aborted, "the shard kill lost or revealed earlier transactions"
        counts = check({p: [(o, v) for o, v in recs if v not in wanted] for p, recs in rows.items()}, writers,
                       "reader after the shard kill", extra=sentinels)
        print(f"shard kill: {summary(writers)}; reader: {counts}")
    finally:
        for producer in made:
            close_quietly(producer)
