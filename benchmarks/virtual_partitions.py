"""The `virtual` scenario (issue 24): what a topic with virtual partitions costs the stores, against plain topics.

One `kafscale serve` (one shard, SeaweedFS, embedded metadata). Three topics take the same load in turn, in the
same run: a plain topic of P partitions, one of V partitions made virtual over P (`kafscale.virtual.partitions`),
and a plain topic of V partitions. The load: RATE keyed records a second of RECORD bytes, acks=all, keys spread
over every partition, for PHASE_S seconds each. Measured from the shard's /metrics over each phase: object PUTs
a second and metadata transactions a second.

The target (issue 24): the virtual topic costs what the plain P-partition topic costs (within 10%), far below the
plain V-partition topic.
"""

from __future__ import annotations

import time
import uuid

from benchmarks.common import Context, Reference, Result, broker, log

P, V = 10, 100
RATE = 2000
RECORD = 512
PHASE_S = 20.0
TOLERANCE = 1.10


def virtual(ctx: Context) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    phase_s = 5.0 if ctx.quick else PHASE_S
    settings = {"physical": P, "virtual": V, "rate": RATE, "record_bytes": RECORD, "phase_s": phase_s}
    with broker(ctx, "seaweedfs", "virtual", shards=1) as b:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        topics = {f"plain-{P}": NewTopic(f"plain-{P}-{uuid.uuid4().hex[:6]}", P),
                  f"virtual-{V}-over-{P}": NewTopic(f"virtual-{uuid.uuid4().hex[:6]}", P,
                                                    config={"kafscale.virtual.partitions": str(V)}),
                  f"plain-{V}": NewTopic(f"plain-{V}-{uuid.uuid4().hex[:6]}", V)}
        for future in admin.create_topics(list(topics.values())).values():
            future.result(60)
        costs: dict[str, dict[str, float]] = {}
        for label, topic in topics.items():
            producer = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5})
            producer.produce(topic.topic, key=b"warm", value=b"x")  # metadata and connections before the clock
            producer.flush(30)
            b.wait_idle()
            before = b.metrics()
            value = b"v" * RECORD
            started = time.monotonic()
            sent = 0
            while (elapsed := time.monotonic() - started) < phase_s:
                due = int(elapsed * RATE)
                while sent < due:
                    try:
                        producer.produce(topic.topic, key=str(sent % 10_000).encode(), value=value)
                        sent += 1
                    except BufferError:
                        producer.poll(0.01)
                producer.poll(0.001)
            assert producer.flush(60) == 0, f"{label}: records not delivered"
            b.wait_idle()
            seconds = time.monotonic() - started
            after = b.metrics()
            costs[label] = {"puts_per_s": _count(before, after, "kafscale_s3_request_duration_seconds",
                                                 ("put_if_absent", "put")) / seconds,
                            "txns_per_s": _count(before, after, "kafscale_metadata_request_duration_seconds",
                                                 ("txn",)) / seconds,
                            "records": sent, "seconds": round(seconds, 2)}
            log(f"virtual: {label}: {costs[label]['puts_per_s']:.1f} PUTs/s, {costs[label]['txns_per_s']:.1f} "
                f"metadata transactions/s ({sent} records in {seconds:.1f} s)")
    virtual_label, small, large = f"virtual-{V}-over-{P}", f"plain-{P}", f"plain-{V}"
    for figure, unit in (("puts_per_s", "PUT/s"), ("txns_per_s", "txn/s")):
        ctx.add(Result("virtual", figure, costs[virtual_label][figure], unit, "seaweedfs", [
            Reference("target", costs[small][figure] * TOLERANCE, unit, "lower",
                      f"{TOLERANCE:.2f}x the plain {P}-partition topic's, measured in the same run"),
            Reference("limit", costs[large][figure], unit, "lower",
                      f"the plain {V}-partition topic's, in the same run")], settings, {"phases": costs}))


def _count(before: dict[str, dict[str, list[float]]], after: dict[str, dict[str, list[float]]], name: str,
           ops: tuple[str, ...]) -> float:
    return sum(after.get(name, {}).get(op, [0.0, 0.0])[1] - before.get(name, {}).get(op, [0.0, 0.0])[1]
               for op in ops)
