"""Clients that hold connections without sending requests: a request must arrive whole within
--request-read-timeout-ms, and one address may hold at most --max-connections-per-ip (docs/security.md). Both are
counted in kafscale_connections_closed."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from kafscale.config import BrokerConfig
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.local_store import LocalDirStore
from kafscale.testing.inprocess import InProcessBroker
from tests.integration.conftest import wait_until
from tests.integration.test_security import call, closed


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    d: Path = tmp_path_factory.mktemp("slow-clients")
    config = BrokerConfig(request_read_timeout_ms=500, max_connections_per_ip=20, metrics_listen="")
    with InProcessBroker(config, meta=lambda: EmbeddedStore(d / "meta.db"),
                         objects=lambda: LocalDirStore(d / "objects")) as b:
        yield b


def closed_for(broker: InProcessBroker, reason: str) -> float:
    assert broker.shard is not None
    value = broker.shard.metrics.registry.get_sample_value("kafscale_connections_closed_total", {"reason": reason})
    return value or 0.0


def connect(broker: InProcessBroker) -> socket.socket:
    host, port = broker.bootstrap.split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def test_a_request_dripped_too_slowly_closes_its_connection(broker: InProcessBroker) -> None:
    before = closed_for(broker, "request_read_timeout")
    with connect(broker) as s:
        started = time.monotonic()
        s.sendall(b"\x00\x00\x00\x40" + b"\x00\x12")  # a 64-byte request, 2 bytes of it
        assert closed(s)
        assert 0.4 < time.monotonic() - started < 5
    assert closed_for(broker, "request_read_timeout") == before + 1
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert admin.list_topics(timeout=10).brokers  # others are served as before


def test_an_idle_connection_between_requests_is_not_a_slow_request(broker: InProcessBroker) -> None:
    with connect(broker) as s:
        assert call(s, 18, 0).error_code == 0
        time.sleep(1.0)  # twice the read timeout, with nothing half sent
        assert call(s, 18, 0, correlation_id=2).error_code == 0


def admitted(broker: InProcessBroker) -> socket.socket | None:
    """A new connection, if the broker takes and answers it; None if it closes it at once."""
    s = connect(broker)
    try:
        assert call(s, 18, 0).error_code == 0
        return s
    except (AssertionError, ConnectionError):
        s.close()
        return None


def test_one_address_may_hold_at_most_max_connections_per_ip(broker: InProcessBroker) -> None:
    held: list[socket.socket] = []
    try:
        # Each one answered, so counted; the broker releases a place only once it has seen the close, so a
        # connection of an earlier test may still hold one for a moment.
        for _ in range(20):
            held.append(wait_until(lambda: admitted(broker), what="a place for a connection"))
        before = closed_for(broker, "max_connections_per_ip")
        with connect(broker) as extra:
            assert closed(extra)
        assert closed_for(broker, "max_connections_per_ip") == before + 1
        held.pop().close()
        again = wait_until(lambda: admitted(broker), what="the freed place taken again")
        again.close()
    finally:
        for s in held:
            s.close()
