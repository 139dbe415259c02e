"""Kafka Connect in distributed mode (Connect's own `ConnectDistributed`, 4.3.1 with its Java client;
tests/jvm/connect_worker.py): a worker keeps its state in three compacted topics of the broker, runs a
file -> topic -> file pipeline (Connect's FileStreamSource and FileStreamSink connectors, created over the REST
API), reads back its config topic after the broker has cleaned it, and survives a restart.

One worker per broker, shared by the tests of this module in order (the last needs the state the others left):

1. it creates its config, offset and status topics itself, compacted;
2. lines go from a source file through a topic into a sink file, exactly and in order;
3. one connector's config is rewritten REWRITES times (its task config too while it runs; then it is stopped);
   the broker cleans the config topic down to a few records per key, and the worker answers the last config;
4. the worker is stopped (SIGTERM) and a new one started on the same topics: it reads the cleaned config topic
   (the last config, the stopped connector's target state, its task config once resumed), the source resumes
   from its stored offset, and the lines appended meanwhile and afterwards arrive in the sink file once each.

Each runs against Apache Kafka 4.4.0 first (`[reference]`, which validates the test), then against Kafscale
(`[kafscale]`, the in-process broker of tests/jvm/conftest.py).

Kafka cleans only closed segments: the worker creates its config topic with segment.ms=100
(`config.storage.segment.ms`) so that Kafka rolls it while the configs are rewritten; Kafscale has no active
segment (docs/compaction.md) and accepts the setting. Both clean a log again only once half of it is dirty
(min.cleanable.dirty.ratio, 0.5), which could leave a dozen records of one key uncleaned for good: the config
topic gets 0.01.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from tests.jvm.connect_worker import ConnectWorker

pytestmark = pytest.mark.timeout(300)

FIRST_LINES = 300  # through the pipeline before the restart
DOWN_LINES = 40  # appended while no worker runs
AFTER_LINES = 40  # appended once the new worker runs
REWRITES = 50  # PUTs of one connector's config
RUNNING_REWRITES = 5  # the first of them while it runs, the others once it is stopped
HANDFUL = 4  # records per key in the cleaned config topic, at most (Kafka keeps its active segment as it is)
SEGMENT_MS = "100"  # Kafka's config topic rolls often enough to be cleaned (Kafscale has no active segment)
DIRTY_RATIO = "0.01"  # and is cleaned again as soon as anything is dirty, not once half of it is


@dataclass
class Cluster:
    """A Connect cluster of one worker on one broker, and what the tests of the module have done to it."""

    name: str
    bootstrap: str
    worker: ConnectWorker
    workdir: Path
    topic: str
    source_file: Path
    sink_file: Path
    lines: list[str] = field(default_factory=list)  # written to the source file so far
    churn: dict[str, str] | None = None  # the churn connector's last config

    @property
    def churn_topic(self) -> str:
        return f"{self.topic}-churn"

    @property
    def config_topic(self) -> str:
        return self.worker.properties()["config.storage.topic"]

    def internal_topics(self) -> list[str]:
        props = self.worker.properties()
        return [props["config.storage.topic"], props["offset.storage.topic"], props["status.storage.topic"]]

    def append(self, count: int) -> None:
        new = [f"line {len(self.lines) + i:05d} {uuid.uuid4().hex}" for i in range(count)]
        with self.source_file.open("a") as f:
            f.write("".join(f"{line}\n" for line in new))
        self.lines.extend(new)

    def sink_lines(self) -> list[str]:
        return self.sink_file.read_text().splitlines() if self.sink_file.exists() else []

    def wait_sink(self, timeout: float = 60.0) -> None:
        """Until the sink file holds as many lines as were written, then a little longer (a line written twice
        would show), and it must hold exactly the lines, in order."""
        deadline = time.monotonic() + timeout
        while len(self.sink_lines()) < len(self.lines):
            assert self.worker.alive(), f"the worker died:\n{self.worker.log()}"
            if time.monotonic() > deadline:
                got = self.sink_lines()
                raise AssertionError(f"the sink file has {len(got)} of {len(self.lines)} lines after {timeout:.0f}s"
                                     f" (last: {got[-1:]})\n{self.worker.log()}")
            time.sleep(0.25)
        time.sleep(1.5)  # three offset flushes more: anything delivered twice is in the file by now
        got = self.sink_lines()
        duplicated = [line for line, n in Counter(got).items() if n > 1]
        assert not duplicated, f"{len(duplicated)} lines reached the sink twice, e.g. {duplicated[:3]}"
        first = next((i for i, (a, b) in enumerate(zip(got, self.lines, strict=False)) if a != b), None)
        assert got == self.lines, (f"the sink file is not the source file: {len(got)} lines, {len(self.lines)} "
                                   f"written, the first difference at line {first}")


def source_config(cluster: Cluster) -> dict[str, str]:
    return {"connector.class": "org.apache.kafka.connect.file.FileStreamSourceConnector", "tasks.max": "1",
            "file": str(cluster.source_file), "topic": cluster.topic}


def sink_config(cluster: Cluster) -> dict[str, str]:
    return {"connector.class": "org.apache.kafka.connect.file.FileStreamSinkConnector", "tasks.max": "1",
            "file": str(cluster.sink_file), "topics": cluster.topic}


def churn_config(cluster: Cluster, revision: int) -> dict[str, str]:
    """A source on a file that stays empty, rewritten with a new batch.size each time. A FileStreamSource's task
    config is its connector's, so while it runs each rewrite also writes its task config and a commit record (and
    restarts its task, which takes a second); once stopped, only its config."""
    return {"connector.class": "org.apache.kafka.connect.file.FileStreamSourceConnector", "tasks.max": "1",
            "file": str(cluster.workdir / "empty.txt"), "topic": cluster.churn_topic, "batch.size": str(100 + revision)}


@pytest.fixture(scope="module", params=["reference", "kafscale"])
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if request.param == "reference":
        bootstrap = str(request.getfixturevalue("kafka_reference").bootstrap)
    else:
        bootstrap = str(request.getfixturevalue("jvm_broker").at("PLAINTEXT"))
    workdir = tmp_path_factory.mktemp(f"connect-{request.param}")
    tag = f"connect-{request.param}-{uuid.uuid4().hex[:8]}"
    worker = ConnectWorker(bootstrap, tag, workdir, extra={"config.storage.segment.ms": SEGMENT_MS,
                                                           "config.storage.min.cleanable.dirty.ratio": DIRTY_RATIO})
    cluster = Cluster(request.param, bootstrap, worker, workdir, f"{tag}-lines", workdir / "source.txt",
                      workdir / "sink.txt")
    cluster.source_file.touch()
    (workdir / "empty.txt").touch()
    try:
        worker.start()
        worker.wait_ready()
        yield cluster
    finally:
        worker.stop()


def describe_topic_configs(bootstrap: str, topics: list[str]) -> dict[str, dict[str, str]]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics])
    return {resource.name: {k: v.value for k, v in future.result(30).items()} for resource, future in futures.items()}


def partition_counts(bootstrap: str, topics: list[str]) -> dict[str, int]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    metadata = admin.list_topics(timeout=30).topics
    return {t: len(metadata[t].partitions) if t in metadata else 0 for t in topics}


def read_log(bootstrap: str, topic: str) -> tuple[list[bytes | None], int]:
    """The keys of every record of partition 0 from the log start to its end, and the end offset."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        keys: list[bytes | None] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                if message.offset() >= end:
                    return keys, end
                continue
            keys.append(message.key())
        raise AssertionError(f"{topic}: the end ({end}) not reached in 30 s, {len(keys)} records read")
    finally:
        consumer.close()


def create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(30)


def ensure_pipeline(cluster: Cluster) -> None:
    """The data topic, the source and sink connectors, and FIRST_LINES through them (once per cluster)."""
    if cluster.lines:
        return
    create_topic(cluster.bootstrap, cluster.topic)
    cluster.append(FIRST_LINES // 2)
    for name, config in (("source", source_config(cluster)), ("sink", sink_config(cluster))):
        cluster.worker.put_connector(name, config)
    for name in ("source", "sink"):
        cluster.worker.wait_running(name)
    cluster.append(FIRST_LINES - FIRST_LINES // 2)  # and some while both run
    cluster.wait_sink()


# ------------------------------------------------------------------------------------------------------ tests


def test_the_worker_creates_its_internal_topics_compacted(cluster: Cluster) -> None:
    topics = cluster.internal_topics()
    configs = describe_topic_configs(cluster.bootstrap, topics)
    assert {t: configs[t]["cleanup.policy"] for t in topics} == dict.fromkeys(topics, "compact")
    # the topic settings the worker was given for it (config.storage.*)
    assert configs[cluster.config_topic]["segment.ms"] == SEGMENT_MS
    assert configs[cluster.config_topic]["min.cleanable.dirty.ratio"] == DIRTY_RATIO
    # Connect's defaults: the config topic must have one partition, the offsets 25, the statuses 5
    assert list(partition_counts(cluster.bootstrap, topics).values()) == [1, 25, 5]


def test_file_source_and_sink_connectors_move_lines_end_to_end(cluster: Cluster) -> None:
    ensure_pipeline(cluster)
    assert len(cluster.sink_lines()) == FIRST_LINES


def wait_state(worker: ConnectWorker, name: str, state: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while (status := worker.rest("GET", f"/connectors/{name}/status"))["connector"]["state"] != state:
        assert time.monotonic() < deadline, f"{name} not {state} in {timeout:.0f}s: {status}\n{worker.log()}"
        time.sleep(0.2)


def test_the_config_topic_stays_small_when_rewritten_many_times(cluster: Cluster) -> None:
    """A connector's config written REWRITES times, its task config RUNNING_REWRITES times, its target state
    twice: once the broker has cleaned the config topic, it holds a few records per key."""
    worker = cluster.worker
    for i in range(REWRITES):
        if i == RUNNING_REWRITES:
            worker.wait_running("churn")
            worker.rest_retrying("PUT", "/connectors/churn/stop")
            wait_state(worker, "churn", "STOPPED")
        cluster.churn = churn_config(cluster, i)
        worker.put_connector("churn", cluster.churn)
    # Kafka rolls a segment only when a record comes segment.ms after its first: rewrites that came faster than
    # that (a quiet machine) share the active segment, which Kafka never cleans. One more, after a pause, rolls it.
    time.sleep(3 * int(SEGMENT_MS) / 1000)
    cluster.churn = churn_config(cluster, REWRITES)
    worker.put_connector("churn", cluster.churn)
    _, written = read_log(cluster.bootstrap, cluster.config_topic)
    assert written >= REWRITES + 2 * RUNNING_REWRITES, f"only {written} records in the config topic"

    deadline = time.monotonic() + 60  # both brokers' cleaners look every 0.5 s here (log.cleaner.backoff.ms)
    while True:
        keys, end = read_log(cluster.bootstrap, cluster.config_topic)
        per_key = Counter(keys)
        if len(keys) <= written // 4 and max(per_key.values()) <= HANDFUL:
            break
        assert time.monotonic() < deadline, (
            f"the config topic was not cleaned in 60 s: {len(keys)} records of {end} written, per key "
            f"{dict(per_key.most_common(5))}")
        time.sleep(1.0)
    assert None not in per_key  # Connect keys every record of its config topic
    assert worker.rest("GET", "/connectors/churn/config") == {**cluster.churn, "name": "churn"}


def test_a_restarted_worker_resumes_where_the_stopped_one_was(cluster: Cluster) -> None:
    ensure_pipeline(cluster)
    worker = cluster.worker
    worker.stop()
    assert worker.proc is not None and worker.proc.returncode in (0, 143), worker.log()  # 143: SIGTERM, closed
    cluster.append(DOWN_LINES)
    worker.start()
    worker.wait_ready()
    for name in ("source", "sink"):
        worker.wait_running(name)
    cluster.append(AFTER_LINES)
    cluster.wait_sink()
    churn = ["churn"] if cluster.churn is not None else []
    assert sorted(worker.rest("GET", "/connectors")) == sorted(["source", "sink", *churn])
    if cluster.churn is not None:
        # what the new worker read from the cleaned config topic: the last config, the target state; and the
        # task config it makes of that config once resumed
        assert worker.rest("GET", "/connectors/churn/config") == {**cluster.churn, "name": "churn"}
        wait_state(worker, "churn", "STOPPED")
        worker.rest_retrying("PUT", "/connectors/churn/resume")
        worker.wait_running("churn")
        tasks = worker.rest("GET", "/connectors/churn/tasks")
        assert [t["config"]["batch.size"] for t in tasks] == [cluster.churn["batch.size"]], tasks
