"""A confluent-kafka member of a KIP-848 group (`group.protocol=consumer`) as a process of its own, for the test
that kills one with SIGKILL (test_consumer_protocol.py).

Usage: python -m tests.integration.consumer_protocol_member BOOTSTRAP GROUP TOPIC [CONFIG_JSON]

It reports on stdout, one JSON object a line, each with `ts` (time.monotonic(), the machine's CLOCK_MONOTONIC, so
comparable with the test's own clock):
  {"ev": "assign" | "revoke" | "lost", "ts": .., "tps": [[topic, partition], ..]}   a rebalance callback
      (assign when it starts, revoke and lost when it has finished, the revoked offsets committed);
  {"ev": "records", "ts": .., "recs": [[topic, partition, offset], ..]}              what one consume() returned;
  {"ev": "committed", "ts": .., "tps": [[topic, partition, offset], ..]}            a commit that succeeded.
Records are written (and flushed) before their offsets are committed, so a record committed but never reported
would be one this member skipped. SIGTERM closes the consumer (it leaves the group).
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import time
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition


def say(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"ev": event, "ts": time.monotonic(), **fields}) + "\n")
    sys.stdout.flush()


def main() -> None:
    bootstrap, group, topic = sys.argv[1:4]
    extra = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    stopping: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False, **extra})

    def commit(c: Consumer) -> None:
        with contextlib.suppress(KafkaException):  # nothing consumed yet, or a rebalance under way
            done: list[TopicPartition] = c.commit(asynchronous=False) or []
            say("committed", tps=[[tp.topic, tp.partition, tp.offset] for tp in done if tp.offset >= 0])

    def on_assign(c: Consumer, partitions: list[TopicPartition]) -> None:
        say("assign", tps=[[tp.topic, tp.partition] for tp in partitions])

    def on_revoke(c: Consumer, partitions: list[TopicPartition]) -> None:
        commit(c)
        say("revoke", tps=[[tp.topic, tp.partition] for tp in partitions])

    def on_lost(c: Consumer, partitions: list[TopicPartition]) -> None:
        say("lost", tps=[[tp.topic, tp.partition] for tp in partitions])

    consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
    while not stopping:
        good = [m for m in consumer.consume(500, 0.1) if not m.error()]
        if good:
            say("records", recs=[[m.topic(), m.partition(), m.offset()] for m in good])
            commit(consumer)
    consumer.close()


if __name__ == "__main__":
    main()
