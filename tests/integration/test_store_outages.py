"""Store outages seen through the wire: S3 or etcd stops, clients get retriable errors within their
request timeout, nothing unstored is acknowledged, and service resumes when the store returns.

Each test runs its own store server (the session's shared ones must stay up for everyone else) and
stops it for real: these are the faults a real component produces.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kafscale.config import BrokerConfig
from kafscale.protocol.errors import ErrorCode
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.etcd_store import EtcdStore
from kafscale.storage.local_store import LocalDirStore
from kafscale.testing.etcd_server import EtcdServer
from kafscale.testing.inprocess import InProcessBroker
from kafscale.testing.s3_servers import SeaweedS3Server
from tests.integration.conftest import KafkaWire
from tests.integration.test_broker_errors import batch, read_all, rows

RETRIABLE = {ErrorCode.kafka_storage_error, ErrorCode.request_timed_out, ErrorCode.not_leader_or_follower}
TIMEOUT_MS = 2_000


def produce_timed(wire: KafkaWire, topic: str, tag: str) -> tuple[ErrorCode, float]:
    start = time.monotonic()
    answer = wire.call(wire.produce_request(topic, 0, batch(rows(tag, 3)), acks=-1, timeout_ms=TIMEOUT_MS))
    return ErrorCode(answer.responses[0].partition_responses[0].error_code), time.monotonic() - start


def produce_until_ok(wire: KafkaWire, topic: str, tag: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        code, _ = produce_timed(wire, topic, tag)
        if code == ErrorCode.none:
            return
        assert code in RETRIABLE, code
        assert time.monotonic() < deadline, f"produce still failing with {code.name} after {timeout}s"
        time.sleep(0.2)


def assert_outage_log(stored: list[bytes]) -> None:
    """The acknowledged "before" records first and the acknowledged "after" attempt last; between them only
    records of attempts answered with a retriable error. A timed-out produce is not a failed one (as with
    Kafka): it may still commit once the store is back, so an earlier "after" attempt of produce_until_ok
    can be there too."""
    assert stored[:3] == [f"before-{i}".encode() for i in range(3)], stored
    assert stored[-3:] == [f"after-{i}".encode() for i in range(3)], stored
    assert all(v.startswith((b"during", b"after")) for v in stored[3:-3]), stored


def values_of(wire: KafkaWire, topic: str, timeout: float = 30) -> list[bytes]:
    """Every key from offset 0, as a consumer reads them: retrying while the health gate is still
    closed (a store that just came back is judged healthy only once the window's errors age out)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = read_all(wire, topic, 0)
            break
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert [o for o, _ in got] == list(range(len(got))), "offsets not contiguous"
    return [r[0] or b"" for _, r in got]


@pytest.fixture
def own_seaweed(tmp_path: Path) -> Iterator[SeaweedS3Server]:
    with SeaweedS3Server(tmp_path / "weed") as server:
        yield server


@pytest.fixture
def own_etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    with EtcdServer(tmp_path / "etcd") as server:
        yield server


def test_s3_outage_gets_retriable_errors_in_time_and_loses_nothing(tmp_path: Path,
                                                                  own_seaweed: SeaweedS3Server) -> None:
    # A cache too small to hold a segment: every fetch below needs the object store.
    config = BrokerConfig(shards_per_node=1, cache_bytes=1, s3_health_window_s=3, flush_interval_ms=20)
    meta_path = tmp_path / "meta.sqlite"
    broker = InProcessBroker(config, meta=lambda: EmbeddedStore(meta_path),
                             objects=lambda: own_seaweed.store("outage", create_bucket=True)).start()
    try:
        with KafkaWire(broker.shard.listener.port) as wire:  # type: ignore[union-attr]
            wire.create_topic("s3-outage", 1)
            produce_until_ok(wire, "s3-outage", "before")
            assert values_of(wire, "s3-outage") == [f"before-{i}".encode() for i in range(3)]

            own_seaweed.stop()
            seen: set[ErrorCode] = set()
            for i in range(6):
                code, took = produce_timed(wire, "s3-outage", f"during{i}")
                assert code in RETRIABLE, f"produce during the outage answered {code.name}"
                assert took < TIMEOUT_MS / 1000 + 1.5, f"produce answered after {took:.1f}s"
                seen.add(code)
            # The health gate closes: later produces are refused at once instead of piling up.
            assert ErrorCode.kafka_storage_error in seen, seen
            assert wire.fetch("s3-outage", 0, 0).error_code == ErrorCode.kafka_storage_error

            own_seaweed.restart()
            produce_until_ok(wire, "s3-outage", "after")
            stored = values_of(wire, "s3-outage")
        # Nothing acknowledged is missing; what timed out during the outage may or may not be there.
        assert_outage_log(stored)
    finally:
        broker.stop()


def test_etcd_outage_gets_retriable_errors_in_time_and_loses_nothing(tmp_path: Path, own_etcd: EtcdServer) -> None:
    config = BrokerConfig(shards_per_node=1, flush_interval_ms=20)
    objects_root = tmp_path / "objects"
    broker = InProcessBroker(config, meta=lambda: EtcdStore(own_etcd.endpoint, prefix="/outage/"),
                             objects=lambda: LocalDirStore(objects_root)).start()
    try:
        with KafkaWire(broker.shard.listener.port) as wire:  # type: ignore[union-attr]
            wire.create_topic("etcd-outage", 2)
            produce_until_ok(wire, "etcd-outage", "before")

            own_etcd.stop()
            for i in range(3):
                code, took = produce_timed(wire, "etcd-outage", f"during{i}")
                assert code in RETRIABLE, f"produce during the outage answered {code.name}"
                assert took < TIMEOUT_MS / 1000 + 1.5, f"produce answered after {took:.1f}s"
            # A partition nobody owns yet cannot be opened without etcd: a retriable error, in time.
            start = time.monotonic()
            answer = wire.call(wire.produce_request("etcd-outage", 1, batch(rows("p1", 1)), timeout_ms=TIMEOUT_MS))
            code = ErrorCode(answer.responses[0].partition_responses[0].error_code)
            assert code in RETRIABLE and time.monotonic() - start < TIMEOUT_MS / 1000 + 1.5, code
            # Committed data stays readable: reads need no metadata store.
            assert values_of(wire, "etcd-outage")[:3] == [f"before-{i}".encode() for i in range(3)]

            own_etcd.restart()
            produce_until_ok(wire, "etcd-outage", "after")
            stored = values_of(wire, "etcd-outage")
        assert_outage_log(stored)
    finally:
        broker.stop()
