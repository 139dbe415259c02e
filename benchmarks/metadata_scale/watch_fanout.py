"""Watch fan-out: W watchers (each its own EtcdStore and connection, as every shard watches `topics/`) in the
worker processes, a writer in the harness putting a topic record every flush interval, and the time from just
before each put to its event's arrival at the watchers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

from benchmarks.common import loadavg, process_cpu_seconds, summary
from benchmarks.metadata_scale.etcd_probes import clear
from benchmarks.metadata_scale.settings import FLUSH_MS, now
from benchmarks.metadata_scale.worker_process import Child, emit
from benchmarks.workers import cpu_seconds

# -- in the worker processes --------------------------------------------------------------------------------------


async def watch_worker(p: dict[str, Any]) -> dict[str, Any]:
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

    cpu0 = cpu_seconds()
    tasks = [asyncio.ensure_future(watch(i)) for i in range(count)]
    await ready.wait()
    emit({"ready": True})
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(all_done.wait(), float(p["timeout_s"]))
    cpu = cpu_seconds() - cpu0
    for task in tasks:
        task.cancel()
    for store in stores:
        await store.close()
    return {"arrivals": {str(seq): v for seq, v in arrivals.items()}, "cpu_s": cpu,
            "complete": done_count == count}


# -- in the harness -----------------------------------------------------------------------------------------------


async def watch_writer(endpoint: str, prefix: str, key: str, children: list[Child], puts: int, gap_s: float,
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


def watch_case(etcd: Any, work: Path, watchers: int, placement: int, puts: int, procs: int) -> dict[str, Any]:
    prefix = f"/bench-watch-{watchers}-{time.monotonic_ns()}/"
    per = [len(range(i, watchers, procs)) for i in range(min(procs, watchers))]
    children = [Child("watch", {"endpoint": etcd.endpoint, "prefix": prefix, "watch_prefix": "topics/",
                                 "watchers": w, "expect": puts, "timeout_s": 60 + puts}, work) for w in per]
    try:
        cpu0 = process_cpu_seconds(etcd.pid)
        t0 = now()
        value_bytes = asyncio.run(watch_writer(etcd.endpoint, prefix, "topics/bench", children, puts,
                                                FLUSH_MS / 1000, placement))
        results = [c.result(120 + puts) for c in children]
        etcd_cpu = process_cpu_seconds(etcd.pid) - cpu0
        elapsed = now() - t0
    finally:
        for c in children:
            c.kill()
    asyncio.run(clear(etcd.endpoint, prefix))
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
            "loadavg": loadavg(),
            "last_watcher_ms": summary(last), "first_watcher_ms": summary(first), "any_watcher_ms": summary(every),
            "missing_events": missing, "client_procs": len(children),
            "client_cpu_s": [round(r["cpu_s"], 3) for r in results],
            "etcd_cpu_s": round(etcd_cpu, 3), "elapsed_s": round(elapsed, 2),
            "value_bytes": value_bytes}
