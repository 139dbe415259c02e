"""The transactional producer of the `transactions` scenario, run as a worker (`benchmarks.workers`).

It produces at a fixed rate, like the `produce` worker at a rate, but inside transactions: one transaction is
committed every `commit_ms`, and each commit_transaction() call is timed (what EndTxn costs a producer, markers
included: Kafscale answers EndTxn once they are durable). With `transactional` false the same loop runs as a
plain idempotent producer, the baseline the scenario compares with.
"""

from __future__ import annotations

import os
import time
from typing import Any

MiB = 1024 * 1024


def txn_produce(p: dict[str, Any]) -> dict[str, Any]:
    from confluent_kafka import Producer

    transactional = bool(p.get("transactional", True))
    conf: dict[str, Any] = {
        "bootstrap.servers": p["bootstrap"], "acks": "all", "linger.ms": 5, "batch.size": MiB,
        "queue.buffering.max.kbytes": 32 * 1024, "compression.type": "none", "enable.idempotence": True,
        "message.timeout.ms": 60000,  # librdkafka: at most transaction.timeout.ms (60 s by default)
    }
    if transactional:
        conf["transactional.id"] = p.get("transactional_id", f"bench-txn-{os.getpid()}")
    producer = Producer(conf)
    topic, partitions, size = p["topic"], int(p["partitions"]), int(p["size"])
    rate, duration, commit_s = float(p["rate"]), float(p["duration"]), float(p.get("commit_ms", 100)) / 1000
    payload = os.urandom(size)
    state = {"delivered": 0, "errors": 0, "first_error": ""}

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is None:
            state["delivered"] += 1
        else:
            state["errors"] += 1
            state["first_error"] = state["first_error"] or str(err)

    producer.list_topics(topic, timeout=30)
    if transactional:
        producer.init_transactions(30)
        producer.begin_transaction()
    commits: list[float] = []
    sent = 0
    t0 = time.monotonic()
    next_commit = t0 + commit_s
    while (now := time.monotonic()) < t0 + duration:
        if transactional and now >= next_commit:
            c0 = time.monotonic()
            producer.commit_transaction(60)
            commits.append(time.monotonic() - c0)
            producer.begin_transaction()
            next_commit = time.monotonic() + commit_s
        if sent >= rate * (now - t0):
            producer.poll(0.001)
            continue
        try:
            producer.produce(topic, payload, partition=sent % partitions, on_delivery=on_delivery)
        except BufferError:
            producer.poll(0.002)
            continue
        sent += 1
        if sent % 500 == 0:
            producer.poll(0)
    if transactional:
        c0 = time.monotonic()
        producer.commit_transaction(60)
        commits.append(time.monotonic() - c0)
    left = producer.flush(120)
    elapsed = time.monotonic() - t0
    commits.sort()

    def pct(q: float) -> float | None:
        return commits[min(len(commits) - 1, int(q * len(commits)))] * 1000 if commits else None

    return {"sent": sent, "delivered": state["delivered"], "errors": state["errors"],
            "first_error": state["first_error"], "undelivered": left, "elapsed_s": elapsed,
            "records_per_s": state["delivered"] / elapsed, "commits": len(commits),
            "commit_p50_ms": pct(0.5), "commit_p99_ms": pct(0.99)}
