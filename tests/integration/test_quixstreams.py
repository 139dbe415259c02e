"""quixstreams (PyPI) with processing_guarantee="exactly-once" (issue 33): a stateful word count whose output
shows every word's counts exactly once and in order, also when its process is killed with kill -9 midway and a new
one starts with an empty state directory.

The app is tests/clients/quix/wordcount.py, run in its own virtual environment (tests/clients/quix/.venv, made by
`make test` from tests/clients/quix/requirements.txt): quixstreams 3.28 pins confluent-kafka below the version
Kafscale needs. It counts in RocksDB with a changelog topic that quixstreams creates compacted, and commits its
output, its changelog and its consumed offsets in one transaction.

What is checked, for each word: the counts a read_committed reader sees on the output are exactly 1, 2, ..., n,
where n is the word's count in the input. A count missing would be a lost update; one repeated or out of order an
update applied twice (the dead instance's open transaction visible, or its work redone on top of a committed one).
The second instance starts with an empty state directory, so its counts come from the compacted changelog.

Each case runs against Apache Kafka 4.4.0 first (`[reference]`), which validates the test, then against Kafscale.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from tests.integration.conftest import Cluster
from tests.xdist_groups import on_reference

pytestmark = pytest.mark.timeout(300)

QUIX = Path(__file__).resolve().parents[1] / "clients" / "quix"
PYTHON = QUIX / ".venv" / "bin" / "python"
PARTITIONS = 3
WORDS = [f"w{i:02d}" for i in range(30)]
DEADLINE_S = 120.0  # the output reaching the input's counts, the app's start and a rebalance included


@pytest.fixture(params=[pytest.param("reference", marks=on_reference), "kafscale"])
def bootstrap(request: pytest.FixtureRequest) -> str:
    if request.param == "reference":
        return str(request.getfixturevalue("kafka_reference").bootstrap)
    cluster: Cluster = request.getfixturevalue("broker_embedded")
    return cluster.bootstrap


class WordCount:
    """One run of the app in its own process, its output kept in a log file."""

    def __init__(self, bootstrap: str, source: str, sink: str, group: str, state_dir: Path, log: Path) -> None:
        self.args = [str(PYTHON), str(QUIX / "wordcount.py"), bootstrap, source, sink, group, str(state_dir)]
        self.log_path = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WordCount:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def apps() -> Iterator[list[WordCount]]:
    made: list[WordCount] = []
    yield made
    for app in made:
        app.kill()


def create_topics(bootstrap: str, *names: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(n, num_partitions=PARTITIONS, replication_factor=1)
                                       for n in names]).values():
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


def produce(bootstrap: str, topic: str, words: list[str]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for word in words:
        producer.produce(topic, key=word.encode(), value=b"1")
    assert producer.flush(30) == 0, "the input was not all delivered"


class Output:
    """The app's output as a read_committed consumer sees it: every count of every word, in order."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex[:8]}",
                                  "isolation.level": "read_committed", "enable.auto.commit": False})
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        self.counts: dict[str, list[int]] = {}

    def poll(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for message in self.consumer.consume(500, timeout=0.2):
                assert message.error() is None, message.error()
                self.counts.setdefault(message.key().decode(), []).append(json.loads(message.value()))

    def wait_for(self, expected: Counter[str], apps: list[WordCount]) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            self.poll(0.5)
            if all(len(self.counts.get(word, ())) >= n for word, n in expected.items()):
                return
            for app in apps:
                assert app.proc is None or app.proc.poll() in (None, -9), f"the app died:\n{app.log()}"
        short = {w: (len(self.counts.get(w, ())), n) for w, n in expected.items() if len(self.counts.get(w, ())) < n}
        raise AssertionError(f"the output did not reach the input's counts in {DEADLINE_S:.0f}s; (seen, expected) "
                             f"of the words short: {short}\n{''.join(app.log() for app in apps)}")

    def close(self) -> None:
        self.consumer.close()


def names(request: pytest.FixtureRequest) -> tuple[str, str, str]:
    tag = f"{re.sub(r'[^A-Za-z0-9]+', '-', request.node.name)[:40]}-{uuid.uuid4().hex[:8]}"
    return f"{tag}-in", f"{tag}-out", f"{tag}-app"


def topic_config(bootstrap: str, topic: str, name: str) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(30)
    return str(configs[name].value)


def test_the_word_count_is_exact_through_a_kill_and_a_restore_from_the_changelog(
        request: pytest.FixtureRequest, bootstrap: str, tmp_path: Path, apps: list[WordCount]) -> None:
    """The input flows in 8 slices while the app runs; after the 3rd its process gets kill -9 (a transaction
    open, offsets and state not yet committed), and a new one starts with an empty state directory while the rest
    flows in: it restores the counts from the changelog and goes on from the committed offsets."""
    source, sink, group = names(request)
    create_topics(bootstrap, source, sink)
    rng = random.Random(7)
    words = [rng.choice(WORDS) for _ in range(2400)]
    expected = Counter(words)
    slices = [words[i::8] for i in range(8)]
    first = WordCount(bootstrap, source, sink, group, tmp_path / "state-1", tmp_path / "app-1.log")
    apps.append(first)
    output = Output(bootstrap, sink)
    try:
        produce(bootstrap, source, slices[0])
        first.start()
        output.wait_for(Counter(slices[0]), apps)
        midway = threading.Event()

        def feed() -> None:
            for i, part in enumerate(slices[1:], start=1):
                produce(bootstrap, source, part)
                if i == 3:
                    midway.set()
                time.sleep(0.3)

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        assert midway.wait(60)
        time.sleep(0.3)  # the app is reading, counting and writing the slices
        first.kill()
        second = WordCount(bootstrap, source, sink, group, tmp_path / "state-2", tmp_path / "app-2.log")
        apps.append(second.start())
        feeder.join(60)
        assert not feeder.is_alive()
        output.wait_for(expected, apps)
        output.poll(2.0)  # anything counted twice would show up after the final counts
        for word, n in expected.items():
            assert output.counts[word] == list(range(1, n + 1)), (
                f"{word}: the counts a read_committed reader sees are not exactly 1..{n}: {output.counts[word]}")
        assert "Recovery successful" in second.log(), second.log()  # its counts came from the changelog
    finally:
        output.close()
    changelog = f"changelog__{group}--{source}--default"
    assert topic_config(bootstrap, changelog, "cleanup.policy") == "compact"
