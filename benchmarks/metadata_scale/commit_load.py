"""What the simulated shards send to etcd, inside the worker processes: each partition's flush commit as
broker/flush.py builds it, sent per flush window ("window"), through the shard's real CommitBatcher
("batcher"), or one at a time by one client (the sequential limits)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from benchmarks.metadata_scale.settings import MAX_PARTITIONS_PER_TXN, now
from benchmarks.metadata_scale.worker_process import emit, wait_go
from benchmarks.workers import cpu_seconds


def txn_ops(topic: str, partitions: range, owner_revision: int, base: int, shard: int) -> tuple[list[Any], list[Any]]:
    """The flush commit of these partitions of `topic`, as broker/flush.py `_commit_locked` builds it."""
    from kafscale.broker.producer_state import BatchMeta, ProducerEntry
    from kafscale.cluster import keys
    from kafscale.cluster.records import SegmentMeta
    from kafscale.storage.metadata_store import Compare, Put

    compares, ops = [], []
    ms = int(time.time() * 1000)
    for p in partitions:
        last = base + 999
        compares.append(Compare(keys.owner(topic, p), "mod_revision", "==", owner_revision))
        ops.append(Put(keys.state(topic, p), {"next_offset": last + 1, "log_start_offset": 0, "epoch": 1}))
        seg = SegmentMeta(base, last, 1_048_576 + p, 1000, ms - 50, ms, 0x1234ABCD, ms, 0)
        ops.append(Put(keys.segment(topic, p, base), seg.to_value()))
        producer = ProducerEntry(1)
        producer.batches.append(BatchMeta(base // 10, base // 10 + 99, base, last))
        ops.append(Put(keys.producer(topic, p, 1000 + shard), producer.to_value()))
    return compares, ops


async def set_up_owners(store: Any, topic: str, k: int, shard: int) -> int:
    """Every partition's owner key, written in one transaction: their common mod_revision."""
    from kafscale.cluster import keys
    from kafscale.storage.metadata_store import Put

    result = await store.txn([], [Put(keys.owner(topic, p), {"epoch": 1, "shard": shard}) for p in range(k)])
    return result.revision


async def commit_worker(p: dict[str, Any]) -> dict[str, Any]:
    """mode "window": each shard sends one transaction for its k partitions per flush window (at most one in
    flight; windows due meanwhile fold into the next). mode "batcher": each of a shard's k partitions has its
    own flush timer (spread over the window, as real ones are) and hands its commit to the shard's
    CommitBatcher (broker/commit_batcher.py), which decides how many transactions that makes."""
    from kafscale.broker.commit_batcher import CommitBatcher
    from kafscale.storage.etcd_store import EtcdStore

    shards, total, k, mode = p["shards"], int(p["total_shards"]), int(p["k"]), p.get("mode", "window")
    interval, warmup, duration = p["flush_ms"] / 1000.0, float(p["warmup_s"]), float(p["duration_s"])
    stores = {s: EtcdStore(p["endpoint"], prefix=p["prefix"]) for s in shards}
    batchers = {s: CommitBatcher(stores[s]) for s in shards}
    revisions = {}
    for s in shards:
        revisions[s] = await set_up_owners(stores[s], f"shard{s}", k, s)
    emit({"ready": True})
    t0 = await wait_go()
    measure_from, end = t0 + warmup, t0 + warmup + duration
    stats: dict[str, Any] = {"window_ms": [], "rtt_ms": [], "tick_lag_ms": [], "offered": 0, "txns": 0,
                             "windows_folded": 0, "failed": 0, "errors": 0, "first_error": ""}

    async def unit(s: int, partitions: range, phase: float) -> None:
        """The committer of these partitions of shard s, with a flush timer `phase` into each window."""
        pending: list[float] = []
        due_event = asyncio.Event()
        ticking = True

        async def ticker() -> None:
            nonlocal ticking
            due = t0 + interval * phase
            while due < end:
                while (delay := due - now()) > 0:  # uvloop's timers may fire up to a millisecond early
                    await asyncio.sleep(delay)
                if due >= measure_from:
                    stats["offered"] += 1
                    stats["tick_lag_ms"].append((now() - due) * 1000)
                pending.append(due)
                due_event.set()
                due += interval
            ticking = False
            due_event.set()

        async def committer() -> None:
            base = 0
            while ticking or pending:
                await due_event.wait()
                due_event.clear()
                if not pending:
                    continue
                batch = pending[:]
                pending.clear()
                compares, ops = txn_ops(f"shard{s}", partitions, revisions[s], base, s)
                base += 1000
                sent = now()
                try:
                    if mode == "batcher":
                        ok = await batchers[s].commit(compares, ops)
                    else:
                        ok = (await stores[s].txn(compares, ops)).succeeded
                except Exception as e:  # counted and reported: a failing etcd is a result too
                    ok = False
                    stats["errors"] += 1
                    stats["first_error"] = stats["first_error"] or f"{type(e).__name__}: {e}"
                done = now()
                if not ok:
                    stats["failed"] += 1
                if measure_from <= done < end:
                    stats["txns"] += mode != "batcher"
                    stats["rtt_ms"].append((done - sent) * 1000)
                in_window = [d for d in batch if measure_from <= d < end]
                stats["window_ms"].extend((done - d) * 1000 for d in in_window)
                stats["windows_folded"] += max(0, len(in_window) - 1)

        await asyncio.gather(ticker(), committer())

    async def window_counters() -> tuple[float, int]:
        await asyncio.sleep(max(0.0, measure_from - now()))
        c0, x0 = cpu_seconds(), sum(b.transactions for b in batchers.values())
        await asyncio.sleep(max(0.0, end - now()))
        return cpu_seconds() - c0, sum(b.transactions for b in batchers.values()) - x0

    counters = asyncio.ensure_future(window_counters())
    if mode == "batcher":  # shards spread over the window, and each shard's partitions over it too
        await asyncio.gather(*(unit(s, range(q, q + 1), (s / total + q / k) % 1.0) for s in shards for q in range(k)))
    else:
        await asyncio.gather(*(unit(s, range(k), s / total) for s in shards))
    cpu, batcher_txns = await counters
    if mode == "batcher":
        stats["txns"] = batcher_txns
    for store in stores.values():
        await store.close()
    return {**stats, "cpu_s": cpu, "duration_s": duration}


async def sequential_worker(p: dict[str, Any]) -> dict[str, Any]:
    """One client, one transaction at a time: compare-and-swap on one key, then flush-shaped transactions."""
    from kafscale.storage.etcd_store import EtcdStore
    from kafscale.storage.metadata_store import Compare, Put

    store = EtcdStore(p["endpoint"], prefix=p["prefix"])
    seconds = float(p["seconds"])
    out: dict[str, Any] = {}
    rev = await store.put("seq/cas", {"n": 0})
    for _ in range(50):  # warm the connection and etcd's caches
        rev = (await store.txn([Compare("seq/cas", "mod_revision", "==", rev)], [Put("seq/cas", {"n": 1})])).revision
    n, c0, t0 = 0, cpu_seconds(), now()
    while now() - t0 < seconds:
        r = await store.txn([Compare("seq/cas", "mod_revision", "==", rev)], [Put("seq/cas", {"n": n})])
        if not r.succeeded:
            raise RuntimeError("sequential CAS lost its own key")
        rev, n = r.revision, n + 1
    elapsed = now() - t0
    out["cas"] = {"txn_s": n / elapsed, "mean_ms": elapsed / n * 1000, "client_cpu_ms": (cpu_seconds() - c0) / n * 1000}
    for k in sorted({int(p["k"]), MAX_PARTITIONS_PER_TXN}):
        topic = f"seq{k}"
        owner_rev = await set_up_owners(store, topic, k, 0)
        n, base, c0, t0 = 0, 0, cpu_seconds(), now()
        while now() - t0 < seconds:
            compares, ops = txn_ops(topic, range(k), owner_rev, base, 0)
            if not (await store.txn(compares, ops)).succeeded:
                raise RuntimeError("sequential flush transaction fenced")
            n, base = n + 1, base + 1000
        elapsed = now() - t0
        out[f"flush_k{k}"] = {"txn_s": n / elapsed, "mean_ms": elapsed / n * 1000, "ops": 4 * k,
                              "client_cpu_ms": (cpu_seconds() - c0) / n * 1000}
    await store.close()
    return out

