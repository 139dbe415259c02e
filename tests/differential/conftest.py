"""Differential tests: the same requests to Apache Kafka, the reference, and to kafscale, the answers compared.

The reference brokers are the session fixtures `kafka_reference` (Apache Kafka 4.4.0) and `kafka_reference_39`
(3.9.2, which still serves the protocol versions Kafka 4.0 removed), from tests/fixtures/kafka_reference.py;
`reference` here is parametrized over both. They are shared by the whole session: every test uses topics (and
group ids) of its own, from `topic`.
"""

from __future__ import annotations

import pytest

from kafscale.testing.kafka_reference import ReferenceKafka
from tests.integration.conftest import unique_topic

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
