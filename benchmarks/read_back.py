"""The `read_back` scenario (issue 40): the measurement that found a release slower than the one before it.

A 2-shard broker; confluent-kafka produces N records of 1 KiB with acks=all into 4 partitions, then one consumer
reads them all back from the beginning while the broker still has them (the cache, as after a burst). Each round
uses a topic of its own on the same broker; the figures are medians over the rounds.

Besides the client-side rates, it reports the shards' own CPU per record (utime + stime of the shard processes
over each phase). The rates depend on the client and on whatever else the 2-core machine runs; the shards' CPU
per record depends on the broker's code alone, so it is the figure that shows a regression first.
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.common import Broker, Context, Result, broker, log, run_worker

RECORD = 1024
PARTITIONS = 4


def _round(b: Broker, topic: str, count: int) -> dict[str, float]:
    made = run_worker("create_topics", {"bootstrap": b.bootstrap, "topics": [(topic, PARTITIONS)], "batch": 1})
    if made["errors"]:
        raise RuntimeError(f"create {topic}: {made['errors']}")
    cpu0 = b.shard_cpu()
    w = run_worker("produce", {"bootstrap": b.bootstrap, "topic": topic, "partitions": PARTITIONS, "size": RECORD,
                               "acks": "all", "count": count, "duration": 0, "warmup": 0}, timeout=900)
    cpu1 = b.shard_cpu()
    r = run_worker("catchup", {"bootstrap": b.bootstrap, "topic": topic, "partitions": PARTITIONS, "expect": count,
                               "timeout": 600}, timeout=700)
    cpu2 = b.shard_cpu()
    if r["received"] != count or w.get("errors"):
        raise RuntimeError(f"read_back round on {topic}: produced {w.get('delivered')} (errors {w.get('errors')}),"
                           f" read {r['received']} of {count}")
    return {"produce_records_s": w["records_per_s"], "read_records_s": count / r["elapsed_s"],
            "produce_shard_cpu_us_per_record": (cpu1 - cpu0) / count * 1e6,
            "read_shard_cpu_us_per_record": (cpu2 - cpu1) / count * 1e6}


def read_back(ctx: Context) -> None:
    count, rounds = (20_000, 2) if ctx.quick else (200_000, 3)
    units = {"produce_records_s": "records/s", "read_records_s": "records/s",
             "produce_shard_cpu_us_per_record": "us/record", "read_shard_cpu_us_per_record": "us/record"}
    for backend in ctx.backends:
        with broker(ctx, backend, "read_back") as b:
            per_round: list[dict[str, float]] = []
            for n in range(rounds):
                per_round.append(_round(b, f"read-back-{n}", count))
                log(f"  round {n}: " + ", ".join(f"{k} {v:,.2f}" for k, v in per_round[-1].items()))
            settings: dict[str, Any] = {**b.settings, "records": count, "record_bytes": RECORD,
                                        "partitions": PARTITIONS, "rounds": rounds, "acks": "all"}
            for name, unit in units.items():
                values = [r[name] for r in per_round]
                ctx.add(Result("read_back", name, statistics.median(values), unit, backend, [], settings,
                               {"rounds": values}))
