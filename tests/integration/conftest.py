"""Integration fixtures: in-process brokers on real stores, and a raw Kafka wire client.

`broker_embedded` runs a shard on the embedded stores (SQLite metadata, local directory objects);
`broker_cloud` runs one on a real etcd and a real SeaweedFS S3 server. Both are session-scoped:
starting a broker costs far more than a test, so tests share them and keep apart by using topic
names of their own (`unique_topic`). `broker` is parametrized over both.

`KafkaWire` speaks the protocol over a plain socket with kio request objects, for what clients
hide: error codes they retry or swallow, requests they never send (acks=0 with a follow-up on the
same connection, a corrupted batch).
"""

from __future__ import annotations

import datetime
import re
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from kafscale.config import BrokerConfig
from kafscale.protocol import FrameBuffer, decode_response, encode_request, make, request_class
from kafscale.protocol.errors import ErrorCode
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.etcd_store import EtcdStore
from kafscale.storage.keys import pack_name_of, parse_segment_key
from kafscale.storage.local_store import LocalDirStore
from kafscale.storage.object_store import ObjectNotFoundError, ObjectStore
from kafscale.storage.pack import TAIL_READ, parse_trailer
from kafscale.testing.etcd_server import EtcdServer
from kafscale.testing.inprocess import InProcessBroker
from kafscale.testing.s3_servers import SeaweedS3Server, unique_bucket_name

T = TypeVar("T")

_NO_TOPIC_ID = uuid.UUID(int=0)
NAMESPACE = "default"  # BrokerConfig.s3_namespace: the first component of every object key

# API keys and the versions the raw client speaks (flexible versions where the broker has them, so
# the compact encodings and request header v2 are exercised too).
PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
CREATE_TOPICS, DELETE_TOPICS = 19, 20
VERSIONS = {PRODUCE: 9, FETCH: 12, LIST_OFFSETS: 7, METADATA: 12, CREATE_TOPICS: 7, DELETE_TOPICS: 6}


# ------------------------------------------------------------------------------------ brokers


@dataclass
class Cluster:
    """A running broker plus an independent handle on the object store it writes to."""

    name: str
    broker: InProcessBroker
    objects: ObjectStore  # the test's own client of the broker's store: to look, never to write

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    @property
    def port(self) -> int:
        return int(self.bootstrap.rsplit(":", 1)[1])

    def object_keys(self, topic: str) -> list[str]:
        """Every object the broker stored for a topic (segments and indexes of all partitions)."""
        return [o.key for o in self.objects.list(f"{NAMESPACE}/{topic}/")]

    def stored_segments(self, topic: str) -> list[StoredSegment]:
        """Every segment stored for a topic, in (partition, base) order: objects of their own, and lanes of packs
        (a plain topic's partitions flushed together, or a virtual topic's), found from the packs' trailers."""
        found = []
        for o in self.objects.list(f"{NAMESPACE}/{topic}/"):
            parsed = parse_segment_key(o.key)
            if parsed is not None and parsed.kind == "kfs" and parsed.topic == topic:
                found.append(StoredSegment(parsed.partition, parsed.base_offset, o.key, 0, o.size))
            elif pack_name_of(o.key, NAMESPACE, topic) is not None:
                try:
                    tail = self.objects.get_range(o.key, max(0, o.size - TAIL_READ), min(TAIL_READ, o.size))
                except ObjectNotFoundError:  # deleted since the listing (retention, the janitor): not stored now
                    continue
                found += [StoredSegment(lane.lane, lane.base, o.key, lane.position, lane.size)
                          for lane in parse_trailer(tail, o.size, o.key).lanes]
        return sorted(found)

    def segment_bytes(self, segment: StoredSegment) -> bytes:
        return self.objects.get_range(segment.key, segment.position, segment.size)

    def wire(self, timeout: float = 30.0) -> KafkaWire:
        return KafkaWire(self.port, timeout=timeout)


@dataclass(frozen=True, order=True)
class StoredSegment:
    partition: int
    base: int
    key: str  # its object: of its own, or a pack
    position: int  # where in the object it starts
    size: int


def _config() -> BrokerConfig:
    # A compacted topic is looked at every half second: the tests wait for cleanings (docs/compaction.md).
    return BrokerConfig(shards_per_node=1, s3_namespace=NAMESPACE, log_cleaner_backoff_ms=500)


@pytest.fixture(scope="session")
def broker_embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("embedded")
    meta_path, objects_root = root / "meta.sqlite", root / "objects"
    broker = InProcessBroker(_config(), meta=lambda: EmbeddedStore(meta_path),
                             objects=lambda: LocalDirStore(objects_root)).start()
    view = LocalDirStore(objects_root)
    try:
        yield Cluster("embedded", broker, view)
    finally:
        try:
            broker.stop()
        finally:
            view.close()


@pytest.fixture(scope="session")
def broker_cloud(etcd_server: EtcdServer, seaweed_server: SeaweedS3Server) -> Iterator[Cluster]:
    prefix = f"/kafscale-it-{uuid.uuid4().hex[:12]}/"
    bucket = unique_bucket_name("kafscale-it")
    broker = InProcessBroker(_config(), meta=lambda: EtcdStore(etcd_server.endpoint, prefix=prefix),
                             objects=lambda: seaweed_server.store(bucket, create_bucket=True)).start()
    view = seaweed_server.store(bucket, create_bucket=False)
    try:
        yield Cluster("cloud", broker, view)
    finally:
        try:
            broker.stop()
        finally:
            view.close()
            seaweed_server.delete_bucket(bucket)


@pytest.fixture(params=["embedded", "cloud"])
def broker(request: pytest.FixtureRequest) -> Cluster:
    """Each test runs once on the embedded stores and once on etcd + SeaweedFS."""
    cluster: Cluster = request.getfixturevalue(f"broker_{request.param}")
    return cluster


def unique_topic(hint: str) -> str:
    """A topic name no other test uses: the hint made legal, plus a random suffix."""
    return f"{re.sub(r'[^A-Za-z0-9._-]+', '-', hint)[:60]}-{uuid.uuid4().hex[:8]}"


def wait_until(condition: Callable[[], T], timeout: float = 30.0, what: str = "condition") -> T:
    """Poll `condition` until it returns something truthy (which is returned) or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout}s (last: {value!r})")
        time.sleep(0.02)


# --------------------------------------------------------------------------------- throughput

_THROUGHPUT = pytest.StashKey[dict[str, list[tuple[int, float]]]]()


def record_throughput(config: pytest.Config, what: str, records: int, seconds: float) -> None:
    """Remember how fast something went; the session's summary lists the means."""
    config.stash.setdefault(_THROUGHPUT, {}).setdefault(what, []).append((records, seconds))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    seen = config.stash.get(_THROUGHPUT, {})
    if not seen:
        return
    terminalreporter.section("client throughput")
    for what, runs in sorted(seen.items()):
        records = sum(n for n, _ in runs)
        seconds = sum(s for _, s in runs)
        terminalreporter.write_line(f"{what:<36} {records / seconds:>10,.0f} records/s  ({len(runs)} runs)")


# ------------------------------------------------------------------------------- raw protocol


def build(api_key: int, /, **fields: Any) -> Any:
    """A request of VERSIONS[api_key] from keyword fields (make() drops what the version lacks)."""
    return make(request_class(api_key, VERSIONS[api_key]), **fields)


def nested_request(api_key: int, name: str, /, **fields: Any) -> Any:
    """A nested request class of VERSIONS[api_key] (e.g. 'TopicProduceData'), built from fields."""
    module = sys.modules[request_class(api_key, VERSIONS[api_key]).__module__]
    return make(getattr(module, name), **fields)


class KafkaWire:
    """One connection speaking raw requests; responses are matched by correlation id."""

    def __init__(self, port: int, timeout: float = 30.0, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.frames = FrameBuffer()
        self.ready: list[bytes] = []
        self._next_corr = 1
        self.sent: dict[int, tuple[int, int]] = {}  # correlation id -> (api key, version), still unanswered

    def __enter__(self) -> KafkaWire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, request: Any) -> int:
        corr = self._next_corr
        self._next_corr += 1
        self.sock.sendall(encode_request(request, corr, "kafscale-it"))
        self.sent[corr] = (type(request).__api_key__, type(request).__version__)
        return corr

    def receive(self) -> tuple[int, Any]:
        """The next response on the connection: (correlation id, decoded body)."""
        while not self.ready:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("connection closed by the broker")
            self.ready += self.frames.feed(data)
        payload = self.ready.pop(0)
        corr = int.from_bytes(payload[:4], "big", signed=True)
        sent = self.sent.pop(corr, None)
        if sent is None:
            raise AssertionError(f"response with unexpected correlation id {corr}")
        _, response = decode_response(*sent, payload)
        return corr, response

    def call(self, request: Any) -> Any:
        corr = self.send(request)
        got, response = self.receive()
        assert got == corr, f"expected the response to {corr}, got {got}"
        return response

    # ---- the requests the tests use

    def metadata(self, topics: list[str] | None, allow_auto_topic_creation: bool = False) -> Any:
        entries = None if topics is None else tuple(nested_request(METADATA, "MetadataRequestTopic", name=t,
                                                                    topic_id=_NO_TOPIC_ID)
                                                     for t in topics)
        return self.call(build(METADATA, topics=entries, allow_auto_topic_creation=allow_auto_topic_creation,
                               include_cluster_authorized_operations=False,
                               include_topic_authorized_operations=False))

    def create_topics(self, topics: list[tuple[str, int, dict[str, str | None]]],
                      validate_only: bool = False) -> Any:
        entries = tuple(
            nested_request(CREATE_TOPICS, "CreatableTopic", name=name, num_partitions=partitions,
                           replication_factor=-1, assignments=(),
                           configs=tuple(nested_request(CREATE_TOPICS, "CreatableTopicConfig", name=k, value=v)
                                         for k, v in configs.items()))
            for name, partitions, configs in topics
        )
        return self.call(build(CREATE_TOPICS, topics=entries, timeout=datetime.timedelta(seconds=30),
                               validate_only=validate_only))

    def create_topic(self, name: str, partitions: int, configs: dict[str, str | None] | None = None) -> None:
        result = self.create_topics([(name, partitions, configs or {})]).topics[0]
        assert result.error_code == ErrorCode.none, (result.error_code, result.error_message)

    def delete_topics(self, names: list[str]) -> Any:
        by_name = tuple(nested_request(DELETE_TOPICS, "DeleteTopicState", name=n, topic_id=None) for n in names)
        return self.call(build(DELETE_TOPICS, topics=by_name, topic_names=tuple(names),
                               timeout=datetime.timedelta(seconds=30)))

    def produce_request(self, topic: str, partition: int, records: bytes, acks: int = -1,
                        timeout_ms: int = 30_000) -> Any:
        part = nested_request(PRODUCE, "PartitionProduceData", index=partition, records=records)
        data = nested_request(PRODUCE, "TopicProduceData", name=topic, partition_data=(part,))
        return build(PRODUCE, transactional_id=None, acks=acks,
                     timeout=datetime.timedelta(milliseconds=timeout_ms), topic_data=(data,))

    def produce(self, topic: str, partition: int, records: bytes, acks: int = -1) -> Any:
        """The partition's answer (PartitionProduceResponse) to a one-partition produce request."""
        response = self.call(self.produce_request(topic, partition, records, acks))
        return response.responses[0].partition_responses[0]

    def fetch(self, topic: str, partition: int, offset: int, max_wait_ms: int = 0, min_bytes: int = 0,
              max_bytes: int = 8 * 1024 * 1024) -> Any:
        """The partition's answer (PartitionData) to a one-partition fetch."""
        part = nested_request(FETCH, "FetchPartition", partition=partition, fetch_offset=offset,
                              partition_max_bytes=max_bytes)
        request = build(FETCH, max_wait=datetime.timedelta(milliseconds=max_wait_ms), min_bytes=min_bytes,
                        max_bytes=max_bytes, topics=(nested_request(FETCH, "FetchTopic", topic=topic,
                                                                    partitions=(part,)),),
                        forgotten_topics_data=(), replica_id=-1)
        return self.call(request).responses[0].partitions[0]

    def list_offset(self, topic: str, partition: int, timestamp: int) -> Any:
        """The partition's answer (ListOffsetsPartitionResponse): -1 latest, -2 earliest, else a time."""
        part = nested_request(LIST_OFFSETS, "ListOffsetsPartition", partition_index=partition, timestamp=timestamp)
        request = build(LIST_OFFSETS, replica_id=-1, isolation_level=0,
                        topics=(nested_request(LIST_OFFSETS, "ListOffsetsTopic", name=topic, partitions=(part,)),))
        return self.call(request).topics[0].partitions[0]

    def end_offsets(self, topic: str, partitions: int) -> list[int]:
        result = []
        for p in range(partitions):
            answer = self.list_offset(topic, p, -1)
            assert answer.error_code == ErrorCode.none, answer
            result.append(int(answer.offset))
        return result
