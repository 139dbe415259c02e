"""A confluent-kafka group member as a process of its own, for tests that kill members (test_groups.py).

Usage: python -m tests.integration.group_worker BOOTSTRAP TOPIC GROUP OUT_FILE STRATEGY

Every consumed record is written to OUT_FILE ("partition offset value") before its offset is committed, so a
record committed but missing from every member's file would be a skipped record. Rebalance callbacks write
"assigned p,p,..." and "revoked p,p,...". SIGTERM closes the consumer cleanly (LeaveGroup).
"""

from __future__ import annotations

import contextlib
import signal
import sys
from typing import Any

from confluent_kafka import Consumer, KafkaException


def main() -> None:
    bootstrap, topic, group, out_path, strategy = sys.argv[1:6]
    out = open(out_path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000,
                         "partition.assignment.strategy": strategy})

    def on_assign(c: Any, partitions: list[Any]) -> None:
        out.write("assigned " + ",".join(str(tp.partition) for tp in partitions) + "\n")

    def on_revoke(c: Any, partitions: list[Any]) -> None:
        out.write("revoked " + ",".join(str(tp.partition) for tp in partitions) + "\n")
        with contextlib.suppress(KafkaException):  # nothing consumed since the last commit
            c.commit(asynchronous=False)

    consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
    while not stopping:
        good = [m for m in consumer.consume(500, 0.2) if not m.error()]
        for m in good:
            out.write(f"{m.partition()} {m.offset()} {m.value().decode()}\n")
        if good:
            with contextlib.suppress(KafkaException):  # e.g. a rebalance began: the next owner re-reads them
                consumer.commit(asynchronous=False)
    consumer.close()
    out.close()


if __name__ == "__main__":
    main()
