"""Kafka Streams exactly-once (processing.guarantee=exactly_once_v2): a word count whose output counts equal
exactly the counts of its input, also when its JVM is killed with kill -9 midway and started again.

The app (streams/src/io/kafscale/streams/WordCount.java, Kafka Streams 4.4.0 from Maven) reads lines from an input
topic, repartitions by word through a topic of its own, counts in a state store with a changelog topic, and writes
word -> count to an output topic, all in transactions. The test produces the lines (confluent-kafka), reads the
output read_committed, and asserts for each word that the counts it shows are strictly increasing (a count repeated
or going back would be an update applied twice, or lost and redone) and that the last is the word's exact count in
the input.

Each test runs against Apache Kafka 4.4.0 first (`[reference]`, the `kafka_reference` fixture), which validates the
test, then against Kafscale (`[kafscale]`, the in-process broker of tests/jvm/conftest.py); the last one, a
partition moved, a shard killed with kill -9 and the broker restarted while the app runs, against a 2-shard
`kafscale serve` only.

The changelog topic is compacted (Streams creates it with cleanup.policy=compact): Kafscale cleans it while the app
runs, and a restarted app with an empty state directory restores its counts from it.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import signal
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafscale.testing.serve_process import START_TIMEOUT_S, ServeProcess
from tests.integration.test_transactions_crashes import leaders, ray_address
from tests.jvm.streams_app import WordCountApp

pytestmark = pytest.mark.timeout(300)

PARTITIONS = 3
WORDS = [f"w{i:02d}" for i in range(40)]
DEADLINE_S = 120.0  # the output reaching the final counts, Streams' start included, on a loaded machine


@pytest.fixture(params=["reference", "kafscale"])
def bootstrap(request: pytest.FixtureRequest) -> str:
    if request.param == "reference":
        return str(request.getfixturevalue("kafka_reference").bootstrap)
    return str(request.getfixturevalue("jvm_broker").at("PLAINTEXT"))


@pytest.fixture
def apps() -> Iterator[list[WordCountApp]]:
    """The test's Streams instances, killed at its end if still running."""
    made: list[WordCountApp] = []
    yield made
    for app in made:
        app.kill()


def create_topics(bootstrap: str, *names: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(n, num_partitions=PARTITIONS, replication_factor=1) for n in names])
    for future in futures.values():
        future.result(30)
    deadline = time.monotonic() + 30
    for n in names:  # Kafka elects the leaders a moment after CreateTopics answers
        while True:
            meta = admin.list_topics(n, timeout=10).topics[n]
            if meta.error is None and len(meta.partitions) == PARTITIONS and all(
                    p.leader >= 0 for p in meta.partitions.values()):
                break
            assert time.monotonic() < deadline, (n, meta)
            time.sleep(0.2)


def lines(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8))) for _ in range(count)]


def produce(bootstrap: str, topic: str, batch: list[str]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i, line in enumerate(batch):
        producer.produce(topic, value=line.encode(), key=str(i).encode())
    assert producer.flush(30) == 0, "the input was not all delivered"


class Output:
    """The word count's output as a read_committed consumer sees it: every count of every word, in order."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex[:8]}",
                                  "isolation.level": "read_committed", "enable.auto.commit": False,
                                  "enable.partition.eof": False})
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        self.counts: dict[str, list[int]] = {}

    def poll(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for message in self.consumer.consume(500, timeout=0.2):
                assert message.error() is None, message.error()
                (count,) = struct.unpack(">q", message.value())
                self.counts.setdefault(message.key().decode(), []).append(count)

    def last(self) -> dict[str, int]:
        return {word: counts[-1] for word, counts in self.counts.items()}

    def wait_for(self, expected: Counter[str], apps: list[WordCountApp], timeout: float = DEADLINE_S) -> None:
        """Polls until every word's last count is at least the expected one (or the time is up)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poll(0.5)
            last = self.last()
            if all(last.get(word, 0) >= n for word, n in expected.items()):
                return
            for app in apps:
                assert app.proc is None or app.proc.poll() in (None, -9), f"the app died:\n{app.log()}"
        missing = {w: (self.last().get(w), n) for w, n in expected.items() if self.last().get(w, 0) < n}
        raise AssertionError(f"the output did not reach the input's counts in {timeout:.0f}s; (last, expected) "
                             f"of the words short: {missing}\n{''.join(app.log() for app in apps)}")

    def close(self) -> None:
        self.consumer.close()


def check_exact(output: Output, expected: Counter[str]) -> None:
    output.poll(2.0)  # anything counted twice would show up after the final counts
    for word, counts in output.counts.items():
        assert all(a < b for a, b in itertools.pairwise(counts)), (
            f"{word}: the counts shown are not strictly increasing (an update applied twice or redone): {counts}")
    assert output.last() == dict(expected)


def names(request: pytest.FixtureRequest) -> tuple[str, str, str]:
    tag = f"{re.sub(r'[^A-Za-z0-9]+', '-', request.node.name)[:40]}-{uuid.uuid4().hex[:8]}"
    return f"{tag}-in", f"{tag}-out", f"{tag}-app"


def test_the_word_count_is_exact(request: pytest.FixtureRequest, bootstrap: str, tmp_path: Path,
                                 apps: list[WordCountApp]) -> None:
    source, sink, app_id = names(request)
    create_topics(bootstrap, source, sink)
    text = lines(1500, seed=1)
    expected = Counter(word for line in text for word in line.split())
    produce(bootstrap, source, text)
    app = WordCountApp(bootstrap, app_id, source, sink, tmp_path / "app")
    apps.append(app)
    app.start()
    output = Output(bootstrap, sink)
    try:
        output.wait_for(expected, apps)
        check_exact(output, expected)
    finally:
        output.close()
    app.stop()
    assert app.proc is not None and app.proc.returncode in (0, 143), app.log()  # 143: closed on SIGTERM


def test_the_word_count_stays_exact_when_its_jvm_is_killed_midway(request: pytest.FixtureRequest, bootstrap: str,
                                                                   tmp_path: Path, apps: list[WordCountApp]) -> None:
    """The input flows in 12 slices while the app runs; after the 5th its JVM gets kill -9 (transactions open,
    offsets and store updates not yet committed), and a new instance starts on the same state directory while
    the rest flows in. What the dead one had not committed is redone once; what it had is not redone."""
    source, sink, app_id = names(request)
    create_topics(bootstrap, source, sink)
    text = lines(3000, seed=2)
    expected = Counter(word for line in text for word in line.split())
    slices = [text[i::12] for i in range(12)]
    first = WordCountApp(bootstrap, app_id, source, sink, tmp_path / "app")
    apps.append(first)
    output = Output(bootstrap, sink)
    try:
        produce(bootstrap, source, slices[0])
        first.start()
        first.wait_running()
        output.wait_for(Counter(word for line in slices[0] for word in line.split()), apps)
        midway = threading.Event()

        def feed() -> None:
            for i, part in enumerate(slices[1:], start=1):
                produce(bootstrap, source, part)
                if i == 5:
                    midway.set()
                time.sleep(0.3)

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        assert midway.wait(60)
        time.sleep(0.2)  # the app is reading, counting and writing the slices
        first.kill()
        first.start()  # the same instance again: its state directory, its application.id
        feeder.join(60)
        assert not feeder.is_alive()
        output.wait_for(expected, apps)
        check_exact(output, expected)
        assert first.runs == 2
    finally:
        output.close()


def changelog_records(bootstrap: str, topic: str) -> int:
    """How many records a consumer reading the topic from its start finds (every partition, to its end)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"count-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        found, ended = 0, set()
        deadline = time.monotonic() + 30
        while len(ended) < PARTITIONS:
            assert time.monotonic() < deadline, f"{topic}: no end of partition after 30 s"
            for message in consumer.consume(500, timeout=0.5):
                if message.error() is None:
                    found += 1
                else:
                    ended.add(message.partition())
        return found
    finally:
        consumer.close()


def test_a_restarted_app_restores_its_counts_from_the_compacted_changelog(
        request: pytest.FixtureRequest, bootstrap: str, tmp_path: Path, apps: list[WordCountApp]) -> None:
    """A KTable's state comes back from its changelog: the app (an in-memory store) counts half the input and
    stops; Kafscale cleans the changelog down to one count per word; a new instance, with an empty state directory,
    restores the store from it and counts the other half. Every word's counts keep increasing to the exact total.
    (Kafka cleans only closed segments, and the changelog's one segment stays open: against it, the restore reads
    every update.)"""
    source, sink, app_id = names(request)
    create_topics(bootstrap, source, sink)
    text = lines(2000, seed=3)
    halves = text[:1000], text[1000:]
    output = Output(bootstrap, sink)
    try:
        produce(bootstrap, source, halves[0])
        # the changelog is cleaned as soon as anything in it is dirty (Streams passes topic.* configs on)
        cleaned_at_once = {"topic.min.cleanable.dirty.ratio": "0.01"}
        first = WordCountApp(bootstrap, app_id, source, sink, tmp_path / "first", store="memory",
                             extra=cleaned_at_once)
        apps.append(first)
        first.start()
        output.wait_for(Counter(word for line in halves[0] for word in line.split()), apps)
        first.stop()
        changelog, words = f"{app_id}-counts-changelog", len({w for line in halves[0] for w in line.split()})
        if "kafscale" in request.node.name:
            deadline = time.monotonic() + 60
            while (found := changelog_records(bootstrap, changelog)) > words:
                assert time.monotonic() < deadline, f"the changelog still holds {found} records for {words} words"
                time.sleep(0.5)
        second = WordCountApp(bootstrap, app_id, source, sink, tmp_path / "second", store="memory",
                              extra=cleaned_at_once)
        apps.append(second)
        second.start()
        produce(bootstrap, source, halves[1])
        expected = Counter(word for line in text for word in line.split())
        output.wait_for(expected, [second])  # the first one stopped on purpose
        check_exact(output, expected)
    finally:
        output.close()


# ------------------------------------------------------------------------------------ a 2-shard `kafscale serve`


def shard_pids(serve: ServeProcess) -> dict[int, int]:
    return {int(s): int(pid) for s, pid in re.findall(r"shard (\d+) listening on \S+ \(Ray actor \S+, pid (\d+)",
                                                       serve.log_text())}


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


def served_again(log_text: str, shard: int, victim: int) -> bool:
    """What a killed shard served (partitions, groups, transaction coordinators) is served again: the controller
    healed it onto a live shard once the lease lapsed, or Ray restarted the shard's actor, which registered anew
    before the lease lapsed and serves its own work again. Which comes first is a race on a loaded machine; a
    client sees the same thing either way."""
    if re.search(rf"healed \d+ partitions and group slots of shards \[{shard}\]", log_text):
        return True
    return any(int(pid) != victim for pid in re.findall(
        rf"pid=(\d+)\)\S*\s+\S+ \S+ INFO kafscale\.cluster\.membership: shard {shard} registered at", log_text))


def move_partition(serve: ServeProcess, topic: str, partition: int) -> None:
    """A planned move of the partition to the other shard, as an operator makes it."""
    target = 1 - leaders(serve.ports[0], topic)[partition]
    done = subprocess.run([sys.executable, "-m", "kafscale.cli", "partition", "move", topic, str(partition), "--to",
                           str(target), "--ray-address", ray_address(serve), "-o", "json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert leaders(serve.ports[0], topic)[partition] == target


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeProcess]:
    process = ServeProcess(tmp_path / "data", shards=2, extra_args=["--flush-interval-ms", "20"])
    try:
        yield process
    finally:
        process.kill()


@pytest.mark.timeout(2 * START_TIMEOUT_S + 300)  # two broker starts, each as long as a loaded machine needs
def test_the_word_count_stays_exact_through_a_move_a_killed_shard_and_a_broker_restart(
        request: pytest.FixtureRequest, serve: ServeProcess, tmp_path: Path, apps: list[WordCountApp]) -> None:
    """Kafscale only (Kafka has no shards): a 2-shard `kafscale serve`; while the input flows in, partition 0 of
    the input and of the output moves to the other shard (`kafscale partition move`, with the app's transactions
    open in it), then the process of shard 1 gets kill -9 (the controller heals its partitions, groups and
    transaction coordinators onto the other shard, or Ray restarts the shard first), then the whole broker
    restarts; the Streams app stays up, its clients find the new leaders and coordinators, and its output ends
    exact."""
    serve.start()  # a `ray start` that gives up on a loaded machine is tried again by serve itself
    bootstrap = serve.bootstrap_all
    source, sink, app_id = names(request)
    create_topics(bootstrap, source, sink)
    text = lines(3000, seed=3)
    expected = Counter(word for line in text for word in line.split())
    slices = [text[i::12] for i in range(12)]
    app = WordCountApp(bootstrap, app_id, source, sink, tmp_path / "app")
    apps.append(app)
    output = Output(bootstrap, sink)
    try:
        produce(bootstrap, source, slices[0])
        app.start()
        app.wait_running()
        output.wait_for(Counter(word for line in slices[0] for word in line.split()), apps)
        for i, part in enumerate(slices[1:], start=1):
            produce(bootstrap, source, part)
            if i == 3:
                for topic in (source, sink):
                    move_partition(serve, topic, 0)
            if i == 5:
                victim = shard_pids(serve)[1]
                os.kill(victim, signal.SIGKILL)
            if i == 8:
                wait_until(lambda pid=victim: served_again(serve.log_text(), 1, pid),
                           f"shard 1 (pid {victim}) was killed, and its work is served neither elsewhere nor by a "
                           f"restarted shard 1: {serve.log_path}")
                # the whole broker restarts under the running app (its transactions open, as its timeout allows)
                assert serve.terminate() == 0, serve.log_path
                serve.start()
            time.sleep(0.3)
        output.wait_for(expected, apps)
        check_exact(output, expected)
        assert app.alive(), app.log()
    finally:
        output.close()
