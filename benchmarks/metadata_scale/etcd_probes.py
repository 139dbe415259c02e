"""The etcd under test, seen from the harness: its /metrics and version, the machine's CPU beside it, and
clearing a step's keys (with a compaction) so that each step starts from a similar database."""

from __future__ import annotations

import contextlib
import subprocess
import urllib.request
from pathlib import Path

from benchmarks.metadata_scale.settings import now


def machine_cpu() -> tuple[int, int, int]:
    """(busy, niced, total) jiffies of the whole machine, from /proc/stat. Niced time is other work's here
    (this benchmark runs at nice 0; the test suites of a shared machine often do not)."""
    values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, values[1], sum(values)


ETCD_METRICS = ("etcd_disk_wal_fsync_duration_seconds_count", "etcd_disk_wal_fsync_duration_seconds_sum",
                "etcd_disk_backend_commit_duration_seconds_count", "etcd_disk_backend_commit_duration_seconds_sum",
                "etcd_mvcc_db_total_size_in_bytes", "etcd_mvcc_db_total_size_in_use_in_bytes",
                "etcd_server_proposals_committed_total")


def etcd_metrics(port: int) -> dict[str, float]:
    out: dict[str, float] = {}
    with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            name, _, value = line.partition(" ")
            if name in ETCD_METRICS:
                out[name] = float(value)
    return out


async def clear(endpoint: str, prefix: str) -> dict[str, float]:
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


def etcd_version(binary: str) -> str:
    with contextlib.suppress(Exception):
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
        return out.splitlines()[0].split()[-1]
    return ""
