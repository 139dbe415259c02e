"""The `transactions` scenario (issue 33): what transactions cost, against idempotent produce at the same load.

A 2-shard broker. librdkafka produces 1 KiB records at a fixed rate into 4 partitions for the same time twice:
as an idempotent producer (the baseline), then as a transactional one committing every 100 ms. Reported:

* the transactional rate over the idempotent one (target: at least 0.8);
* commit_transaction() latency p50 and p99: EndTxn, which answers once every marker is durable;
* metadata-store transactions per committed transaction, over what the idempotent run needed per second of the
  same load: the coordinator's writes (Ongoing, PrepareCommit, CompleteCommit) and the markers' flushes.
"""

from __future__ import annotations

from typing import Any

from benchmarks.common import Broker, Context, Reference, Result, broker, log, run_worker

RECORD = 1024
PARTITIONS = 4
COMMIT_MS = 100


def _meta_txns(b: Broker) -> float:
    return b.metrics().get("kafscale_metadata_request_duration_seconds", {}).get("txn", [0.0, 0.0])[1]


def _run(b: Broker, topic: str, rate: int, duration: float, transactional: bool) -> tuple[dict[str, Any], float]:
    made = run_worker("create_topics", {"bootstrap": b.bootstrap, "topics": [(topic, PARTITIONS)], "batch": 1})
    if made["errors"]:
        raise RuntimeError(f"create {topic}: {made['errors']}")
    b.wait_idle()
    m0 = _meta_txns(b)
    w = run_worker("txn_produce", {"bootstrap": b.bootstrap, "topic": topic, "partitions": PARTITIONS,
                                   "size": RECORD, "rate": rate, "duration": duration, "commit_ms": COMMIT_MS,
                                   "transactional": transactional}, timeout=duration + 300)
    b.wait_idle()
    if w["errors"] or w["undelivered"]:
        raise RuntimeError(f"transactions scenario on {topic}: {w['errors']} errors ({w['first_error']}),"
                           f" {w['undelivered']} undelivered")
    return w, _meta_txns(b) - m0


def transactions(ctx: Context) -> None:
    rate, duration = (5_000, 5.0) if ctx.quick else (20_000, 20.0)
    for backend in ctx.backends:
        with broker(ctx, backend, "transactions") as b:
            idem, idem_meta = _run(b, "txn-bench-idempotent", rate, duration, transactional=False)
            txn, txn_meta = _run(b, "txn-bench-transactional", rate, duration, transactional=True)
            log(f"  idempotent {idem['records_per_s']:,.0f} rec/s, transactional {txn['records_per_s']:,.0f} rec/s,"
                f" commit p50 {txn['commit_p50_ms']:.1f} ms p99 {txn['commit_p99_ms']:.1f} ms,"
                f" {txn['commits']} commits, metadata txns {txn_meta:.0f} vs {idem_meta:.0f}")
            settings: dict[str, Any] = {**b.settings, "rate": rate, "duration_s": duration, "record_bytes": RECORD,
                                        "partitions": PARTITIONS, "commit_ms": COMMIT_MS}
            ratio = txn["records_per_s"] / idem["records_per_s"]
            ctx.add(Result("transactions", "transactional_over_idempotent", ratio, "x", backend,
                           [Reference("target", 0.8, "x", "higher", "transactional produce at least 0.8x the"
                                      " idempotent rate at the same offered load")],
                           settings, {"idempotent_records_s": idem["records_per_s"],
                                      "transactional_records_s": txn["records_per_s"]}))
            for q in ("p50", "p99"):
                ctx.add(Result("transactions", f"end_txn_{q}_ms", txn[f"commit_{q}_ms"], "ms", backend, [],
                               settings, {"commits": txn["commits"]}))
            per_commit = txn_meta / max(txn["commits"], 1)
            baseline = idem_meta / max(txn["commits"], 1)  # the same load's flush commits, per the same interval
            ctx.add(Result("transactions", "metadata_txns_per_commit", per_commit, "txns", backend, [],
                           settings, {"idempotent_same_interval": baseline, "commits": txn["commits"]}))
