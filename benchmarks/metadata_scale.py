"""Metadata load of N shards on a real etcd, and watch fan-out to W watchers (docs/scaling.md, issue 20).

What one shard asks of etcd: one partition's flush commit is a compare of its owner key's mod_revision (fencing)
and puts of the partition state, the new segment's record and the producer state (broker/flush.py
`_commit_locked`): 4 operations per partition. A shard's owners hand their commits to one CommitBatcher
(broker/commit_batcher.py), which sends a commit at once when no transaction is in flight and merges the ones
that arrive meanwhile (at most MAX_TXN_OPS, 120 operations). Two sweeps, with the project's EtcdStore (one gRPC
connection per shard), key layout and value shapes:

- "window" (the model of docs/scaling.md): each of N simulated shards sends one transaction for its k partitions
  (default 8: 32 operations) per flush interval (default 50 ms), at most one in flight; windows that come due
  meanwhile wait and go together in the next one (carrying the latest state; the real flush would have sealed
  larger segments meanwhile). Shards' windows are spread evenly over the interval.
- "batcher" (what the code does today): each of the k partitions of a shard has its own flush timer (spread over
  the interval, as real ones are) and commits through the shard's real CommitBatcher; the figure is how many
  transactions that makes.

Latency counts from when a window came due, not from when its transaction was sent, so a slow etcd shows up as
growing latency, and in "window" as fewer transactions than offered.

The shards are asyncio tasks in a few client processes (`--client-procs`, default 2) on uvloop, like the
shard actors. The client processes' CPU, etcd's CPU and how late the simulated flush timers fired are
reported, so that a client-bound step is seen as one. The limits measured in the same run on the same etcd:
one client's sequential compare-and-swap rate on one key and sequential flush-shaped transactions (k and
30 partitions).

Watch fan-out: W watchers (each its own EtcdStore and connection, as every shard watches `topics/`, where
placement lives) on one prefix, spread over the client processes; a writer puts a topic record (with a
placement list of 250 partitions, and once with 10,000) every 50 ms; the figure is the time from just before
the put to the event's arrival at the last watcher.

    python -m benchmarks.metadata_scale [--quick] [--shards 1,2,4] [--watchers 1,8] [--partitions-per-txn 8]

prints one JSON object on stdout. `python -m benchmarks --scenario metadata_scale` runs the same as a scenario
of the harness (its results in results.json).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import select
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, Context, Reference, Result, log, percentile

FLUSH_MS = 50.0
PARTITIONS_PER_TXN = 8  # one shard's owners flushing in one window: 8 x 4 = 32 operations
MAX_PARTITIONS_PER_TXN = 30  # MAX_TXN_OPS (120) / 4 operations per partition
SHARDS_FULL = [1, 2, 4, 8, 16, 32, 64, 128, 256]
SHARDS_QUICK = [1, 4, 16, 64, 256]
BATCHER_SHARDS_FULL = [1, 4, 16, 64]  # the real CommitBatcher, each partition on its own flush timer
BATCHER_SHARDS_QUICK = [1, 16]
WATCHERS = [1, 8, 32, 100]
PLACEMENT_SMALL, PLACEMENT_LARGE = 250, 10_000  # partitions in the watched topic record
CLIENT_PROCS = 2
SATURATED_FRACTION = 0.9  # achieved below 90 % of offered, or
SATURATED_P99_MS = 250.0  # window-to-commit p99 above this: saturated
CLK = time.CLOCK_MONOTONIC  # system-wide, so times taken in different processes compare


def now() -> float:
    return time.clock_gettime(CLK)


# -- the workers (child processes) -----------------------------------------------------------------------------


def _emit(obj: dict[str, Any]) -> None:
    # Straight to the file descriptor: after uvloop.run, writes through sys.stdout beyond one pipe's worth
    # (64 KiB) were lost without an error, and the results of a busy step are larger than that.
    data = (json.dumps(obj) + "\n").encode()
    os.set_blocking(1, True)
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


async def _wait_go() -> float:
    """The start time the harness sends on stdin once every worker is ready."""
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    return float(line)


def _txn_ops(topic: str, partitions: range, owner_revision: int, base: int, shard: int) -> tuple[list[Any], list[Any]]:
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


async def _set_up_owners(store: Any, topic: str, k: int, shard: int) -> int:
    """Every partition's owner key, written in one transaction: their common mod_revision."""
    from kafscale.cluster import keys
    from kafscale.storage.metadata_store import Put

    result = await store.txn([], [Put(keys.owner(topic, p), {"epoch": 1, "shard": shard}) for p in range(k)])
    return result.revision


async def _commit_worker(p: dict[str, Any]) -> dict[str, Any]:
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
        revisions[s] = await _set_up_owners(stores[s], f"shard{s}", k, s)
    _emit({"ready": True})
    t0 = await _wait_go()
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
                compares, ops = _txn_ops(f"shard{s}", partitions, revisions[s], base, s)
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
        c0, x0 = _cpu(), sum(b.transactions for b in batchers.values())
        await asyncio.sleep(max(0.0, end - now()))
        return _cpu() - c0, sum(b.transactions for b in batchers.values()) - x0

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


async def _watch_worker(p: dict[str, Any]) -> dict[str, Any]:
    from kafscale.storage.etcd_store import EtcdStore

    count, expect, prefix = int(p["watchers"]), int(p["expect"]), p["watch_prefix"]
    stores = [EtcdStore(p["endpoint"], prefix=p["prefix"]) for _ in range(count)]
    seen_probe = [False] * count
    arrivals: dict[int, list[float]] = {}  # seq -> latency at each watcher, ms
    ready = asyncio.Event()
    done_count = 0
    all_done = asyncio.Event()

    async def watch(i: int) -> None:
        nonlocal done_count
        got = 0
        async for ev in stores[i].watch(prefix):
            t = now()
            value = ev.value
            if value.get("probe"):
                if not seen_probe[i]:
                    seen_probe[i] = True
                    if all(seen_probe):
                        ready.set()
                continue
            arrivals.setdefault(value["seq"], []).append((t - value["t"]) * 1000)
            got += 1
            if got >= expect:
                break
        done_count += 1
        if done_count == count:
            all_done.set()

    cpu0 = _cpu()
    tasks = [asyncio.ensure_future(watch(i)) for i in range(count)]
    await ready.wait()
    _emit({"ready": True})
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(all_done.wait(), float(p["timeout_s"]))
    cpu = _cpu() - cpu0
    for task in tasks:
        task.cancel()
    for store in stores:
        await store.close()
    return {"arrivals": {str(seq): v for seq, v in arrivals.items()}, "cpu_s": cpu,
            "complete": done_count == count}


async def _sequential_worker(p: dict[str, Any]) -> dict[str, Any]:
    """One client, one transaction at a time: compare-and-swap on one key, then flush-shaped transactions."""
    from kafscale.storage.etcd_store import EtcdStore
    from kafscale.storage.metadata_store import Compare, Put

    store = EtcdStore(p["endpoint"], prefix=p["prefix"])
    seconds = float(p["seconds"])
    out: dict[str, Any] = {}
    rev = await store.put("seq/cas", {"n": 0})
    for _ in range(50):  # warm the connection and etcd's caches
        rev = (await store.txn([Compare("seq/cas", "mod_revision", "==", rev)], [Put("seq/cas", {"n": 1})])).revision
    n, c0, t0 = 0, _cpu(), now()
    while now() - t0 < seconds:
        r = await store.txn([Compare("seq/cas", "mod_revision", "==", rev)], [Put("seq/cas", {"n": n})])
        if not r.succeeded:
            raise RuntimeError("sequential CAS lost its own key")
        rev, n = r.revision, n + 1
    elapsed = now() - t0
    out["cas"] = {"txn_s": n / elapsed, "mean_ms": elapsed / n * 1000, "client_cpu_ms": (_cpu() - c0) / n * 1000}
    for k in sorted({int(p["k"]), MAX_PARTITIONS_PER_TXN}):
        topic = f"seq{k}"
        owner_rev = await _set_up_owners(store, topic, k, 0)
        n, base, c0, t0 = 0, 0, _cpu(), now()
        while now() - t0 < seconds:
            compares, ops = _txn_ops(topic, range(k), owner_rev, base, 0)
            if not (await store.txn(compares, ops)).succeeded:
                raise RuntimeError("sequential flush transaction fenced")
            n, base = n + 1, base + 1000
        elapsed = now() - t0
        out[f"flush_k{k}"] = {"txn_s": n / elapsed, "mean_ms": elapsed / n * 1000, "ops": 4 * k,
                              "client_cpu_ms": (_cpu() - c0) / n * 1000}
    await store.close()
    return out


def _worker_main(kind: str, params: dict[str, Any]) -> None:
    fn = {"commit": _commit_worker, "watch": _watch_worker, "sequential": _sequential_worker}[kind]
    try:
        import uvloop  # the shard actors' loop (docs/performance.md, "Process settings")

        result = uvloop.run(fn(params))
    except ImportError:
        result = asyncio.run(fn(params))
    _emit(result)


# -- the harness side ---------------------------------------------------------------------------------------------


class _Child:
    """`python -m benchmarks.metadata_scale --worker KIND JSON`: JSON lines on stdout, "go" on stdin."""

    def __init__(self, kind: str, params: dict[str, Any], log_dir: Path) -> None:
        self.kind = kind
        self.err_path = log_dir / f"worker-{kind}-{os.getpid()}-{time.monotonic_ns()}.stderr"
        with open(self.err_path, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.metadata_scale", "--worker", kind,
                                          json.dumps(params)], cwd=REPO, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err, text=True)

    def _stderr(self) -> str:
        with contextlib.suppress(OSError):
            return self.err_path.read_text()[-3000:]
        return ""

    def line(self, timeout: float) -> dict[str, Any] | None:
        """The next JSON line, or None if none came within timeout."""
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        text = self.proc.stdout.readline()
        if not text:
            raise RuntimeError(f"worker {self.kind} exited ({self.proc.wait()}): {self._stderr()}")
        return json.loads(text)

    def go(self, t0: float) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{t0!r}\n")
        self.proc.stdin.flush()

    def result(self, timeout: float) -> dict[str, Any]:
        got = self.line(timeout)
        if got is None:
            raise TimeoutError(f"worker {self.kind}: no result within {timeout}s: {self._stderr()}")
        self.proc.wait(30)
        return got

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(OSError):
            self.err_path.unlink()


def _proc_cpu(pid: int) -> float:
    """utime + stime of a process, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_cpu() -> tuple[int, int, int]:
    """(busy, niced, total) jiffies of the whole machine, from /proc/stat. Niced time is other work's here
    (this benchmark runs at nice 0; the test suites of a shared machine often do not)."""
    values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, values[1], sum(values)


_ETCD_METRICS = ("etcd_disk_wal_fsync_duration_seconds_count", "etcd_disk_wal_fsync_duration_seconds_sum",
                 "etcd_disk_backend_commit_duration_seconds_count", "etcd_disk_backend_commit_duration_seconds_sum",
                 "etcd_mvcc_db_total_size_in_bytes", "etcd_mvcc_db_total_size_in_use_in_bytes",
                 "etcd_server_proposals_committed_total")


def _etcd_metrics(port: int) -> dict[str, float]:
    out: dict[str, float] = {}
    with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            name, _, value = line.partition(" ")
            if name in _ETCD_METRICS:
                out[name] = float(value)
    return out


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - now()))


def _summary(values: list[float]) -> dict[str, float | None]:
    return {"p50": percentile(values, 50), "p99": percentile(values, 99), "max": max(values) if values else None,
            "count": len(values)}


def _start_etcd(work: Path) -> Any:
    from kafscale.testing.etcd_server import EtcdServer

    server = EtcdServer(work / "etcd-data", name="kafscale-bench")
    server.start()
    return server


async def _clear(endpoint: str, prefix: str) -> dict[str, float]:
    """Delete a step's keys and compact etcd's history, so each step starts from a similar database. Returns
    how long each took: a physical compaction waits until the history is gone from the backend, which takes
    seconds after a busy step (what issue 23's scheduled compaction will meet)."""
    from kafscale.storage.etcd_store import EtcdStore

    store = EtcdStore(endpoint, prefix=prefix, timeout=300.0)
    try:
        t0 = now()
        await store.delete("", prefix=True)
        t1 = now()
        revision = await store.revision()
        await store.compact(revision)
        return {"delete_s": round(t1 - t0, 3), "compact_s": round(now() - t1, 3), "compacted_to_revision": revision}
    finally:
        await store.close()


def _commit_step(etcd: Any, work: Path, n: int, k: int, flush_ms: float, warmup: float, duration: float,
                 procs: int, mode: str = "window") -> dict[str, Any]:
    prefix = f"/bench-meta-{n}-{time.monotonic_ns()}/"
    groups = [list(range(i, n, procs)) for i in range(min(procs, n))]
    children = [_Child("commit", {"endpoint": etcd.endpoint, "prefix": prefix, "shards": g, "total_shards": n,
                                  "k": k, "flush_ms": flush_ms, "warmup_s": warmup, "duration_s": duration,
                                  "mode": mode}, work)
                for g in groups]
    try:
        for c in children:
            if c.line(120) is None:
                raise TimeoutError("commit worker not ready within 120 s")
        t0 = now() + 0.2
        for c in children:
            c.go(t0)
        _sleep_until(t0 + warmup)
        cpu0, m0, box0 = _proc_cpu(etcd.pid), _etcd_metrics(etcd.metrics_port), _machine_cpu()
        _sleep_until(t0 + warmup + duration)
        cpu1, m1, box1 = _proc_cpu(etcd.pid), _etcd_metrics(etcd.metrics_port), _machine_cpu()
        results = [c.result(120 + duration) for c in children]
    finally:
        for c in children:
            c.kill()
    cleared = asyncio.run(_clear(etcd.endpoint, prefix))
    window = [x for r in results for x in r["window_ms"]]
    rtt = [x for r in results for x in r["rtt_ms"]]
    lag = [x for r in results for x in r["tick_lag_ms"]]
    windows = sum(r["offered"] for r in results)  # flush windows due in the measured window (shard or partition)
    txns = sum(r["txns"] for r in results)
    # "window": one transaction per shard per window is the offer. "batcher": the partitions' windows are; how
    # many transactions the batcher makes of them is the figure.
    offered = windows / duration if mode == "window" else n * 1000.0 / flush_ms
    achieved = txns / duration
    partition_windows = windows * (k if mode == "window" else 1)
    fsyncs = m1.get(_ETCD_METRICS[0], 0) - m0.get(_ETCD_METRICS[0], 0)
    fsync_s = m1.get(_ETCD_METRICS[1], 0) - m0.get(_ETCD_METRICS[1], 0)
    commits = m1.get(_ETCD_METRICS[2], 0) - m0.get(_ETCD_METRICS[2], 0)
    folded = sum(r["windows_folded"] for r in results)
    step = {
        "mode": mode, "shards": n, "partitions_per_shard": k, "flush_ms": flush_ms,
        "ops_per_txn": 4 * k if mode == "window" else None,
        "offered_txn_s": round(offered, 1), "achieved_txn_s": round(achieved, 1),
        "achieved_fraction": round(achieved / offered, 4) if offered else None,
        "partition_windows_s": round(partition_windows / duration, 1),
        "partition_commits_per_txn": round(partition_windows / txns, 2) if txns else None,
        "window_to_commit_ms": _summary(window), "txn_round_trip_ms": _summary(rtt),
        "timer_lag_ms": _summary(lag),
        "windows_folded": folded,
        "failed_txns": sum(r["failed"] for r in results), "errors": sum(r["errors"] for r in results),
        "first_error": next((r["first_error"] for r in results if r["first_error"]), ""),
        "client_procs": len(children),
        "client_cpu_cores": [round(r["cpu_s"] / duration, 3) for r in results],
        "client_cpu_ms_per_txn": round(sum(r["cpu_s"] for r in results) / max(1, sum(r["txns"] for r in results))
                                       * 1000, 3),
        "etcd_cpu_cores": round((cpu1 - cpu0) / duration, 3),
        "etcd_cpu_ms_per_txn": round((cpu1 - cpu0) / max(1.0, achieved * duration) * 1000, 3),
        "machine_cpu_busy": round((box1[0] - box0[0]) / max(1, box1[2] - box0[2]), 3),
        "machine_cpu_niced": round((box1[1] - box0[1]) / max(1, box1[2] - box0[2]), 3),
        "etcd_wal_fsyncs_s": round(fsyncs / duration, 1),
        "etcd_wal_fsync_mean_ms": round(fsync_s / fsyncs * 1000, 3) if fsyncs else None,
        "etcd_backend_commits_s": round(commits / duration, 1),
        "etcd_db_bytes_after": m1.get(_ETCD_METRICS[4]),
        # History kept until compaction: what each transaction adds to the database (issue 23's quota).
        "etcd_db_in_use_growth_bytes_per_txn": round((m1.get(_ETCD_METRICS[5], 0) - m0.get(_ETCD_METRICS[5], 0))
                                                     / max(1.0, achieved * duration), 1),
        "warmup_s": warmup, "duration_s": duration, "cleared_after": cleared,
        "loadavg": [round(x, 2) for x in os.getloadavg()],  # the machine may be shared: read figures beside it
    }
    p99 = step["window_to_commit_ms"]["p99"]
    if mode == "window":
        behind = achieved < SATURATED_FRACTION * offered
    else:  # a window that had to wait for its partition's previous commit
        behind = folded > (1 - SATURATED_FRACTION) * windows
    step["saturated"] = bool(windows and (behind or p99 is None or p99 > SATURATED_P99_MS))
    busy = max(step["client_cpu_cores"])
    step["client_bound"] = busy > 0.85  # one client process near a whole core: the figure is the client's
    return step


async def _watch_writer(endpoint: str, prefix: str, key: str, children: list[_Child], puts: int, gap_s: float,
                        placement: int) -> int:
    """Puts the watched record `puts` times; returns its size as stored (msgpack) in bytes."""
    import msgpack

    from kafscale.storage.etcd_store import EtcdStore

    store = EtcdStore(endpoint, prefix=prefix)
    record = {"id": "0" * 32, "partitions": placement, "configs": {"retention.ms": "604800000"},
              "created_ms": int(time.time() * 1000), "placement": [p % 64 for p in range(placement)]}
    try:
        waiting = list(children)
        deadline = now() + 120
        while waiting:  # probes until every watcher has seen one: all streams are established
            if now() > deadline:
                raise TimeoutError("watchers not established within 120 s")
            await store.put(key, {"probe": True})
            await asyncio.sleep(0.1)
            waiting = [c for c in waiting if c.line(0) is None]
        await asyncio.sleep(0.3)
        for seq in range(puts):
            await store.put(key, {**record, "seq": seq, "t": now()})
            await asyncio.sleep(gap_s)
        return len(msgpack.packb({**record, "seq": 0, "t": now()}, use_bin_type=True))
    finally:
        await store.close()


def _watch_case(etcd: Any, work: Path, watchers: int, placement: int, puts: int, procs: int) -> dict[str, Any]:
    prefix = f"/bench-watch-{watchers}-{time.monotonic_ns()}/"
    per = [len(range(i, watchers, procs)) for i in range(min(procs, watchers))]
    children = [_Child("watch", {"endpoint": etcd.endpoint, "prefix": prefix, "watch_prefix": "topics/",
                                 "watchers": w, "expect": puts, "timeout_s": 60 + puts}, work) for w in per]
    try:
        cpu0 = _proc_cpu(etcd.pid)
        t0 = now()
        value_bytes = asyncio.run(_watch_writer(etcd.endpoint, prefix, "topics/bench", children, puts,
                                                FLUSH_MS / 1000, placement))
        results = [c.result(120 + puts) for c in children]
        etcd_cpu = _proc_cpu(etcd.pid) - cpu0
        elapsed = now() - t0
    finally:
        for c in children:
            c.kill()
    asyncio.run(_clear(etcd.endpoint, prefix))
    last, first, every = [], [], []
    missing = 0
    for seq in range(puts):
        got = [x for r in results for x in r["arrivals"].get(str(seq), [])]
        missing += watchers - len(got)
        if got:
            last.append(max(got))
            first.append(min(got))
            every.extend(got)
    return {"watchers": watchers, "placement_partitions": placement, "puts": puts, "put_gap_ms": FLUSH_MS,
            "loadavg": [round(x, 2) for x in os.getloadavg()],
            "last_watcher_ms": _summary(last), "first_watcher_ms": _summary(first), "any_watcher_ms": _summary(every),
            "missing_events": missing, "client_procs": len(children),
            "client_cpu_s": [round(r["cpu_s"], 3) for r in results],
            "etcd_cpu_s": round(etcd_cpu, 3), "elapsed_s": round(elapsed, 2),
            "value_bytes": value_bytes}


def measure(work: Path, quick: bool, shards: list[int] | None = None, watchers: list[int] | None = None,
            k: int = PARTITIONS_PER_TXN, flush_ms: float = FLUSH_MS, procs: int = CLIENT_PROCS,
            batcher_shards: list[int] | None = None) -> dict[str, Any]:
    """Start etcd, run the limits, the commit sweep and the watch fan-out; return everything as a dict."""
    if not 1 <= k <= MAX_PARTITIONS_PER_TXN:
        raise ValueError(f"partitions per transaction must be 1..{MAX_PARTITIONS_PER_TXN} (etcd's 128 operations)")
    work.mkdir(parents=True, exist_ok=True)
    shards = shards or (SHARDS_QUICK if quick else SHARDS_FULL)
    watchers = watchers or WATCHERS
    warmup, duration = (1.0, 3.0) if quick else (2.0, 6.0)
    puts = 30 if quick else 80
    t_start, load_at_start = now(), [round(x, 2) for x in os.getloadavg()]
    etcd = _start_etcd(work)
    try:
        log(f"metadata_scale: etcd {etcd.binary} on {etcd.endpoint} (pid {etcd.pid})")
        seq_child = _Child("sequential", {"endpoint": etcd.endpoint, "prefix": "/bench-seq/", "k": k,
                                          "seconds": 1.5 if quick else 3.0}, work)
        try:
            sequential = seq_child.result(120)
        finally:
            seq_child.kill()
        asyncio.run(_clear(etcd.endpoint, "/bench-seq/"))
        log(f"  sequential: CAS {sequential['cas']['txn_s']:.0f} txn/s, flush k={k} "
            f"{sequential[f'flush_k{k}']['txn_s']:.0f} txn/s")
        steps: list[dict[str, Any]] = []
        batcher_steps: list[dict[str, Any]] = []
        for mode, counts, out in (("window", shards, steps),
                                  ("batcher", batcher_shards or (BATCHER_SHARDS_QUICK if quick else
                                                                 BATCHER_SHARDS_FULL), batcher_steps)):
            saturated_in_a_row = 0
            for n in counts:
                step = _commit_step(etcd, work, n, k, flush_ms, warmup, duration, procs, mode)
                out.append(step)
                log(f"  {mode}, {n} shards: offered {step['offered_txn_s']} achieved {step['achieved_txn_s']} "
                    f"txn/s ({step['partition_commits_per_txn']} partition commits each), window->commit p50 "
                    f"{step['window_to_commit_ms']['p50']:.1f} p99 {step['window_to_commit_ms']['p99']:.1f} ms, "
                    f"client CPU {step['client_cpu_cores']}, etcd CPU {step['etcd_cpu_cores']}"
                    f"{' SATURATED' if step['saturated'] else ''}")
                saturated_in_a_row = saturated_in_a_row + 1 if step["saturated"] else 0
                if saturated_in_a_row >= 2:  # past the knee: larger N only repeats it, slower
                    break
        fanout = []
        cases = [(w, PLACEMENT_SMALL) for w in watchers] + [(max(watchers), PLACEMENT_LARGE)]
        for w, placement in cases:
            case = _watch_case(etcd, work, w, placement, puts, procs)
            fanout.append(case)
            log(f"  {w} watchers, placement of {placement}: last watcher p50 {case['last_watcher_ms']['p50']:.2f} "
                f"p99 {case['last_watcher_ms']['p99']:.2f} ms (missing {case['missing_events']})")
    finally:
        etcd.stop()
    knee = next((s["shards"] for s in steps if s["saturated"]), None)
    return {
        "benchmark": "metadata_scale",
        "etcd": {"binary": etcd.binary, "version": _etcd_version(etcd.binary),
                 "settings": "one member on 127.0.0.1, data on local disk, heartbeat 50 ms, election 500 ms"},
        "quick": quick, "flush_ms": flush_ms, "partitions_per_txn": k, "client_procs": procs,
        "cpus": len(os.sched_getaffinity(0)), "loadavg_at_start": load_at_start,
        "sequential": sequential,
        "commit_steps": steps,
        "batcher_steps": batcher_steps,
        "saturation": {"first_saturated_shards": knee,
                       "rule": f"achieved < {SATURATED_FRACTION:.0%} of offered or window->commit p99 > "
                               f"{SATURATED_P99_MS:g} ms",
                       "largest_unsaturated_shards": max((s["shards"] for s in steps if not s["saturated"]),
                                                         default=None)},
        "watch_fanout": fanout,
        "seconds": round(now() - t_start, 1),
    }


def _etcd_version(binary: str) -> str:
    with contextlib.suppress(Exception):
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
        return out.splitlines()[0].split()[-1]
    return ""


# -- as a scenario of `python -m benchmarks` ----------------------------------------------------------------------


def metadata_scale(ctx: Context) -> None:
    data = measure(ctx.work / "metadata-scale", ctx.quick)
    (ctx.out / "metadata_scale.json").write_text(json.dumps(data, indent=1))
    seq = data["sequential"]
    k = data["partitions_per_txn"]
    ctx.limits["etcd_sequential_cas_txn_s"] = seq["cas"]["txn_s"]
    ctx.limits[f"etcd_sequential_flush_k{k}_txn_s"] = seq[f"flush_k{k}"]["txn_s"]
    settings = {"backend": "etcd", "etcd": data["etcd"], "flush_ms": data["flush_ms"], "partitions_per_txn": k,
                "ops_per_txn": 4 * k, "client_procs": data["client_procs"]}
    seq_ref = Reference("limit", seq["cas"]["txn_s"], "txn/s", "higher",
                        "one client's sequential CAS on one key, same etcd, same run")
    ctx.add(Result("metadata_scale", "etcd_sequential_cas_txn_s", seq["cas"]["txn_s"], "txn/s", "etcd",
                   [Reference("limit", 1800.0, "txn/s", "higher", "BRIEF.md: 1,700-1,900 sequential CAS/s here")],
                   settings, {"sequential": seq}))
    for name, figure in seq.items():
        if name.startswith("flush_k"):
            ctx.add(Result("metadata_scale", f"etcd_sequential_{name}_txn_s", figure["txn_s"], "txn/s", "etcd",
                           [seq_ref], {**settings, "ops_per_txn": figure["ops"]}, {"figure": figure}))
    for step in data["commit_steps"]:
        n = step["shards"]
        s = {**settings, "shards": n, "warmup_s": step["warmup_s"], "duration_s": step["duration_s"]}
        offered = step["offered_txn_s"]
        ctx.add(Result("metadata_scale", f"commit_txn_s_{n}_shards", step["achieved_txn_s"], "txn/s", "etcd",
                       [Reference("target", SATURATED_FRACTION * offered, "txn/s", "higher",
                                  "90 % of the offered rate (N shards x 1 per flush interval)"),
                        Reference("limit", offered, "txn/s", "higher", "offered: N shards x 1 per flush interval"),
                        seq_ref], s, {"step": step}))
        lat = step["window_to_commit_ms"]
        for q in ("p50", "p99"):
            ctx.add(Result("metadata_scale", f"commit_latency_{q}_ms_{n}_shards", lat[q], "ms", "etcd",
                           [Reference("target", SATURATED_P99_MS, "ms", "lower",
                                      "saturation rule: window->commit p99 above 250 ms"),
                            Reference("limit", step["txn_round_trip_ms"][q] or 0.0, "ms", "lower",
                                      "the transaction's own round trip (without waiting for the one in flight)")]
                           if q == "p99" else [], s))
    for step in data["batcher_steps"]:
        n = step["shards"]
        s = {**settings, "mode": "batcher: each partition on its own flush timer, through CommitBatcher",
             "shards": n, "partitions_per_shard": k, "ops_per_txn": None, "warmup_s": step["warmup_s"],
             "duration_s": step["duration_s"]}
        ctx.add(Result("metadata_scale", f"batcher_txn_s_{n}_shards", step["achieved_txn_s"], "txn/s", "etcd",
                       [Reference("limit", step["partition_windows_s"], "txn/s", "lower",
                                  "one transaction per partition commit (nothing merged)"),
                        Reference("limit", step["offered_txn_s"], "txn/s", "lower",
                                  "one transaction per shard per flush window (everything merged)")], s,
                       {"step": step}))
        ctx.add(Result("metadata_scale", f"batcher_latency_p99_ms_{n}_shards", step["window_to_commit_ms"]["p99"],
                       "ms", "etcd", [Reference("target", SATURATED_P99_MS, "ms", "lower",
                                                "saturation rule: window->commit p99 above 250 ms")], s))
    sat = data["saturation"]
    ctx.add(Result("metadata_scale", "first_saturated_shards", sat["first_saturated_shards"], "shards", "etcd",
                   [], {**settings, "rule": sat["rule"], "shards_tried": [s["shards"] for s in data["commit_steps"]]},
                   {"saturation": sat}))
    for case in data["watch_fanout"]:
        w, placement = case["watchers"], case["placement_partitions"]
        name = f"watch_last_watcher_{{q}}_ms_{w}_watchers" + ("" if placement == PLACEMENT_SMALL else
                                                              f"_placement_{placement}")
        for q in ("p50", "p99"):
            ctx.add(Result("metadata_scale", name.format(q=q), case["last_watcher_ms"][q], "ms", "etcd",
                           [Reference("limit", data["flush_ms"], "ms", "lower",
                                      "one flush interval (the put spacing)")],
                           {**settings, "watchers": w, "placement_partitions": placement, "puts": case["puts"]},
                           {"case": case} if q == "p50" else {}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter windows and fewer steps")
    parser.add_argument("--shards", help="comma-separated shard counts (default 1..256 doubling; quick 1,4,16,64,256)")
    parser.add_argument("--watchers", help="comma-separated watcher counts (default 1,8,32,100)")
    parser.add_argument("--batcher-shards",
                        help="shard counts of the CommitBatcher sweep (default 1,4,16,64; quick 1,16)")
    parser.add_argument("--partitions-per-txn", type=int, default=PARTITIONS_PER_TXN)
    parser.add_argument("--flush-ms", type=float, default=FLUSH_MS)
    parser.add_argument("--client-procs", type=int, default=CLIENT_PROCS)
    parser.add_argument("--worker", nargs=2, metavar=("KIND", "JSON"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker_main(args.worker[0], json.loads(args.worker[1]))
        return

    def ints(text: str | None) -> list[int] | None:
        return [int(x) for x in text.split(",")] if text else None

    with tempfile.TemporaryDirectory(prefix="kafscale-bench-meta-") as tmp:
        data = measure(Path(tmp), args.quick, ints(args.shards), ints(args.watchers), args.partitions_per_txn,
                       args.flush_ms, args.client_procs, ints(args.batcher_shards))
    json.dump(data, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
