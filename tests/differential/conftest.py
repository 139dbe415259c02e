"""Differential tests: the same requests to Apache Kafka, the reference, and to kafscale, the answers compared.

The reference brokers are the session fixtures `kafka_reference` (Apache Kafka 4.4.0) and `kafka_reference_39`
(3.9.2, which still serves the protocol versions Kafka 4.0 removed), from tests/fixtures/kafka_reference.py;
`reference` here is parametrized over both. They are shared by the whole session: every test uses topics (and
group ids) of its own, from `topic`.

Kafscale is `kafscale`: the integration suite's in-process broker on the embedded stores (`broker_embedded`, one
shard). `peers` opens one raw connection to each of Kafka 4.4.0 and Kafscale (tests/differential/wire.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kafscale.testing.kafka_reference import ReferenceKafka
from tests.differential.wire import Peer, Peers
from tests.integration.conftest import Cluster, unique_topic
from tests.integration.conftest import broker_embedded as broker_embedded  # the fixture, for `kafscale`

REFERENCES = ["kafka_reference", "kafka_reference_39"]


@pytest.fixture(params=REFERENCES)
def reference(request: pytest.FixtureRequest) -> ReferenceKafka:
    """Each test runs once against Apache Kafka 4.4.0 and once against 3.9.2."""
    kafka: ReferenceKafka = request.getfixturevalue(request.param)
    return kafka


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name no other test of the session uses."""
    return unique_topic(request.node.name)


@pytest.fixture
def kafscale(broker_embedded: Cluster) -> Cluster:
    """Kafscale: one in-process shard on the embedded stores, shared by the session."""
    return broker_embedded


@pytest.fixture
def peers(kafka_reference: ReferenceKafka, kafscale: Cluster) -> Iterator[Peers]:
    """A raw connection to Apache Kafka 4.4.0 and one to Kafscale."""
    with Peer("kafka", kafka_reference.port) as kafka, Peer("kafscale", kafscale.port) as ours:
        yield Peers(kafka, ours)
