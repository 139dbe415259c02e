"""A quixstreams exactly-once word count: the app tests/integration/test_quixstreams.py runs against a broker.

Reads records keyed by word from the input topic, counts each word in a RocksDB state store (whose changelog topic
quixstreams creates compacted), and writes word -> count (JSON) to the output topic. With
processing_guarantee="exactly-once" the output, the changelog and the consumed offsets commit in one Kafka
transaction, so a kill -9 at any moment neither repeats nor loses a count once the app runs again.

Runs in its own virtual environment (tests/clients/quix/.venv): quixstreams pins an older confluent-kafka than
Kafscale's own. Usage: wordcount.py BOOTSTRAP INPUT OUTPUT GROUP STATE_DIR

The app runs as a deployment would: a stable transactional.id (quixstreams makes a random one per start unless
given one), so that a restarted instance fences the dead one and aborts its open transaction at once instead of
leaving it to `transaction.timeout.ms`; and a short session timeout, so that the group drops a killed member soon.
"""

from __future__ import annotations

import sys
from typing import Any

from quixstreams import Application, State


def count(_value: Any, state: State) -> int:
    seen = int(state.get("count", 0)) + 1
    state.set("count", seen)
    return seen


def main(bootstrap: str, source: str, sink: str, group: str, state_dir: str) -> None:
    app = Application(broker_address=bootstrap, consumer_group=group, auto_offset_reset="earliest",
                      processing_guarantee="exactly-once", state_dir=state_dir, commit_interval=0.5,
                      consumer_extra_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000},
                      producer_extra_config={"transactional.id": f"{group}-wordcount"}, loglevel="INFO")
    words = app.topic(source, key_deserializer="str", value_deserializer="str")
    counts = app.topic(sink, key_serializer="str", value_serializer="json")
    app.dataframe(words).apply(count, stateful=True).to_topic(counts)
    app.run()


if __name__ == "__main__":
    main(*sys.argv[1:6])
