"""The `idempotent` scenario (issue 36): idempotent producers against 1 and 3 shards, beside plain ones.

Into 12 partitions spread over the shards, 1 KiB records, acks=all, first plain, then idempotent:
- librdkafka: one producer, flat out, `linger.ms` 5, for a fixed time. Plain, it keeps up to a million requests in
  flight per connection; idempotent, at most 5 per connection and (it counts records, not requests) one per
  partition once a request holds 5 records;
- Kafka's ProducerPerformance (the Java client at its defaults: batch.size 16 KiB, linger.ms 5, 5 requests in
  flight per connection), a fixed number of records.
The target: idempotent at least 0.9x plain against 3 shards, for both clients. Also reported for librdkafka, from
the shards' /metrics and /proc: Produce requests answered and their mean size, the mean acks=all round trip the
broker saw (request duration), the shards' CPU per request, and the client's CPU.
"""

from __future__ import annotations

from typing import Any

from benchmarks.common import Broker, Context, Reference, Result, broker, log, run_worker
from benchmarks.vs_kafka import kafscale_side, producer_performance

PARTITIONS = 12
RECORD_BYTES = 1024
TARGET = 0.9


def _produce_requests(b: Broker) -> tuple[float, float]:
    """(count, seconds summed) of the Produce requests the shards answered so far."""
    total, count = b.metrics().get("kafscale_request_duration_seconds", {}).get("Produce", [0.0, 0.0])
    return count, total


def _run(b: Broker, topic: str, idempotent: bool, duration: float) -> dict[str, Any]:
    cpu0, (req0, sec0) = b.shard_cpu(), _produce_requests(b)
    out = run_worker("produce", {"bootstrap": b.bootstrap, "topic": topic, "partitions": PARTITIONS,
                                 "size": RECORD_BYTES, "duration": duration, "acks": "all", "linger_ms": 5,
                                 "conf": {"enable.idempotence": idempotent}})
    cpu, (req, sec) = b.shard_cpu() - cpu0, _produce_requests(b)
    requests = req - req0
    if out["errors"] or out["undelivered"]:
        raise RuntimeError(f"{'idempotent' if idempotent else 'plain'} producer: {out['errors']} errors, "
                           f"{out['undelivered']} undelivered, first {out['first_error']!r}")
    b.wait_idle()
    return {"mib_per_s": out["mib_per_s"], "client_cpu_fraction": out["client_cpu_fraction"],
            "produce_requests": requests,
            "request_kib": out["delivered"] * RECORD_BYTES / 1024 / requests if requests else None,
            "round_trip_ms": (sec - sec0) / requests * 1000 if requests else None,
            "shard_cpu_us_per_request": cpu / requests * 1e6 if requests else None,
            "latency_p50_ms": out["latency"].get("p50_ms")}


def idempotent(ctx: Context) -> None:
    duration = 5.0 if ctx.quick else 10.0
    java_records = 50_000 if ctx.quick else 200_000
    for backend in ctx.backends:
        for shards in (1, 3):
            with broker(ctx, backend, f"idempotent-{shards}", shards=shards) as b:
                topic = f"idem-{shards}"
                made = run_worker("create_topics", {"bootstrap": b.bootstrap, "topics": [(topic, PARTITIONS)]})
                if made["errors"]:
                    raise RuntimeError(f"create {topic}: {made['errors']}")
                plain = _run(b, topic, False, duration)
                idem = _run(b, topic, True, duration)
                log(f"  {backend}, {shards} shard(s): plain {plain}; idempotent {idem}")
                settings = {"shards": shards, "partitions": PARTITIONS, "record_bytes": RECORD_BYTES, "acks": "all",
                            "linger_ms": 5, "duration_s": duration,
                            "flush_interval_ms": b.settings["flush_interval_ms"],
                            "client": "librdkafka (confluent-kafka), one producer, flat out"}
                _report(ctx, backend, shards, "librdkafka", plain["mib_per_s"], idem["mib_per_s"], settings,
                        {"plain": plain, "idempotent": idem})
                java = {idempotent: _java(ctx, b, f"java-{shards}-{idempotent}", idempotent, java_records)
                        for idempotent in (False, True)}
                log(f"  {backend}, {shards} shard(s), Java ProducerPerformance: {java}")
                _report(ctx, backend, shards, "java", java[False]["mib_s"], java[True]["mib_s"],
                        {**settings, "client": "Kafka's ProducerPerformance (Java client, its defaults apart from "
                                               "acks=all and enable.idempotence)", "records": java_records},
                        {"plain": java[False], "idempotent": java[True]})


def _java(ctx: Context, b: Broker, topic: str, idempotent: bool, records: int) -> dict[str, float]:
    work = ctx.work / "idempotent-java"
    work.mkdir(exist_ok=True)
    side = kafscale_side(b, work)
    side.create(topic, PARTITIONS)
    out = producer_performance(work, side, topic, RECORD_BYTES, records, "all", idempotent)
    b.wait_idle()
    return out


def _report(ctx: Context, backend: str, shards: int, client: str, plain: float, idem: float,
            settings: dict[str, Any], extra: dict[str, Any]) -> None:
    ctx.add(Result("idempotent", f"{client}_plain_{shards}_shards_mib_s", round(plain, 2), "MiB/s", backend,
                   settings=settings, extra=extra))
    refs = [Reference("limit", round(plain, 2), "MiB/s", "higher",
                      f"the plain producer against the same {shards} shard(s), same run")]
    if shards > 1:
        refs.insert(0, Reference("target", round(TARGET * plain, 2), "MiB/s", "higher",
                                 f"{TARGET}x the plain producer against {shards} shards (issue 36)"))
    ctx.add(Result("idempotent", f"{client}_idempotent_{shards}_shards_mib_s", round(idem, 2), "MiB/s", backend,
                   refs, settings, extra))
