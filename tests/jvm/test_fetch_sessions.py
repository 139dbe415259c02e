"""The Java consumer fetches through fetch sessions (KIP-227): after its first full fetch, a member that goes on
reading sends incremental fetches, and reads every record through them."""

from __future__ import annotations

import uuid

import pytest

from tests.jvm.conftest import JvmBroker
from tests.jvm.harness import Driver

pytestmark = pytest.mark.timeout(600)


@pytest.mark.parametrize("version", ["4.4.0", "2.8.2"])
def test_the_java_consumer_reads_through_incremental_fetches(jvm_broker: JvmBroker, version: str) -> None:
    sessions = jvm_broker.broker.shard.core.fetch_sessions  # type: ignore[union-attr]
    topic = f"sessions-{version.replace('.', '')}-{uuid.uuid4().hex[:8]}"
    member = {"name": "open", "op": "open", "member": "m", "topics": [topic],
              "config": {"group.id": f"{topic}-group", "heartbeat.interval.ms": 500, "session.timeout.ms": 10000}}
    steps = [
        {"name": "create", "op": "create_topics", "topics": [{"name": topic, "partitions": 4}]},
        {"name": "first", "op": "produce", "topic": topic, "count": 20},
        member,
        {"name": "read-first", "op": "poll", "members": ["m"], "assigned": 4, "records": 20},
        {"name": "second", "op": "produce", "topic": topic, "count": 20, "value_prefix": "w"},
        {"name": "read-second", "op": "poll", "members": ["m"], "assigned": 4, "records": 20},
        {"name": "close", "op": "close", "member": "m"},
    ]
    before = sessions.incremental
    run = Driver(version).run(jvm_broker.plaintext(), steps)
    first = run.ok("read-first")["members"]["m"]["records"]
    second = run.ok("read-second")["members"]["m"]["records"]
    assert sorted(r[3] for r in first) == sorted(f"v{i}" for i in range(20))
    assert sorted(r[3] for r in second) == sorted(f"w{i}" for i in range(20))
    assert sessions.incremental > before, "the consumer never fetched incrementally"
