"""Profile the broker under the produce-throughput load with py-spy: `python -m benchmarks.profile`.

Starts a broker on the local store (or SeaweedFS, `--backend seaweedfs`), runs the 1 KiB / acks=all /
4-partition producer from a worker process, and meanwhile samples every busy process of the broker
(the shards, the metadata actor, the controller, the serve driver) with
`py-spy record --format raw --threads --nonblocking` (pausing the process for every sample, `--blocking`,
slows a process with many threads several times over). Writes to the output folder:

* `<process>-<pid>.txt`: collapsed stacks (flamegraph.pl / speedscope can open them),
* `<process>-<pid>.speedscope.json`: the same, for https://www.speedscope.app,
* `cpu.json`: CPU seconds of every broker process (and the client) over the window, from /proc,
* `profile.md`: per process, the top functions by self time and by inclusive time, and per thread.

Needs py-spy in the venv (`pip install py-spy`) and ptrace rights over the broker (same user).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    REPO,
    Context,
    Worker,
    _cmdline,
    broker,
    broker_pids,
    loadavg,
    log,
    machine_info,
    metrics_delta,
    process_cpu_seconds,
    set_aside_cpus,
)


def _cpu_s(pid: int) -> float | None:
    try:
        return process_cpu_seconds(pid)
    except OSError:
        return None


def _label(pid: int) -> str:
    cmd = _cmdline(pid)
    text = " ".join(cmd)
    if text.startswith("ray::"):
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", cmd[0].removeprefix("ray::"))[:40]
    if "kafscale.cli serve" in text:
        return "serve-driver"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(cmd[0]).name if cmd else str(pid))[:40]


def _function(frame: str) -> str:
    """'fn (path/to/file.py:123)' -> 'fn (file.py)': aggregate over lines of one function."""
    m = re.match(r"(.*) \((.*?):\d+\)$", frame)
    if not m:
        return frame
    path = m.group(2)
    short = "/".join(path.split("/")[-2:]) if "kafscale" in path else Path(path).name
    return f"{m.group(1)} ({short})"


# Leaf frames of a thread that is blocked, not running: py-spy cannot always tell idle threads apart
# in this VM, so they are dropped here ("active" samples are the rest).
_IDLE_LEAVES = ("select (selectors.py)", "Condition.wait (threading.py)", "Worker.main_loop (worker.py)",
                "_worker (thread.py)", "EmbeddedStore._writer_main (storage/embedded_store.py)",
                "Worker.print_logs (worker.py)", "listen_error_messages (worker.py)", "Event.wait (threading.py)",
                "Thread.join (threading.py)", "_wait_for_tstate_lock (threading.py)", "sleep (time)")


def _idle(fn: str) -> bool:
    return fn.endswith(_IDLE_LEAVES) or fn.startswith("EpollSelector.select")


def summarize(raw_path: Path, top: int = 25) -> dict[str, Any]:
    self_t: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    total = idle = 0
    for line in raw_path.read_text(errors="replace").splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        frames = stack.split(";")
        thread = frames[0] if frames and frames[0].startswith(("thread", "process")) else "?"
        body = [f for f in frames if not f.startswith(("thread (", "process "))]
        if not body or _idle(_function(body[-1])):
            idle += count
            continue
        total += count
        threads[thread] += count
        if body:
            self_t[_function(body[-1])] += count
        for fn in {_function(f) for f in body}:
            incl[fn] += count
    return {
        "samples": total,
        "idle_samples": idle,
        "threads": threads.most_common(10),
        "self": self_t.most_common(top),
        "inclusive": incl.most_common(top),
    }


def to_speedscope(raw_path: Path, out: Path, name: str) -> None:
    frames: list[dict[str, str]] = []
    index: dict[str, int] = {}
    samples: list[list[int]] = []
    weights: list[int] = []
    for line in raw_path.read_text(errors="replace").splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        ids = []
        for f in stack.split(";"):
            if f not in index:
                index[f] = len(frames)
                frames.append({"name": f})
            ids.append(index[f])
        samples.append(ids)
        weights.append(int(count_s))
    doc = {
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "shared": {"frames": frames},
        "profiles": [{"type": "sampled", "name": name, "unit": "none", "startValue": 0,
                      "endValue": sum(weights), "samples": samples, "weights": weights}],
        "exporter": "benchmarks.profile",
    }
    out.write_text(json.dumps(doc))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=20.0, help="sampling window, seconds")
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--idempotent", action="store_true", help="the producer is idempotent")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--acks", default="all")
    parser.add_argument("--backend", choices=["local", "seaweedfs"], default="local",
                        help="object store of the broker (seaweedfs: its CPU is counted too)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--native", action="store_true", help="py-spy --native (C frames too; slower)")
    parser.add_argument("--s3-cpus", type=int, default=0,
                        help="SeaweedFS on this many CPUs of its own, everything else on the rest")
    parser.add_argument("--blocking", action="store_true",
                        help="let py-spy pause the process for each sample (exact stacks, but a process with "
                             "many threads then runs several times slower)")
    parser.add_argument("--cpu-only", action="store_true",
                        help="no py-spy (it pauses the process it samples): CPU by process and broker histograms only")
    args = parser.parse_args(argv)
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not args.cpu_only and not Path(pyspy).exists():
        raise SystemExit("py-spy not found: .venv/bin/pip install py-spy")
    out = (args.out or REPO / "benchmarks" / "results" / (time.strftime("%Y%m%d-%H%M%S") + "-profile")).absolute()
    out.mkdir(parents=True, exist_ok=True)
    options: dict[str, Any] = {}
    if args.s3_cpus:
        options["s3_cpus"], options["other_cpus"] = set_aside_cpus(args.s3_cpus)
    ctx = Context(out, False, [args.backend], options)
    report: dict[str, Any] = {"machine": machine_info(), "settings": vars(args) | {"out": str(out)}}
    try:
        with broker(ctx, args.backend, "profile", shards=args.shards) as b:
            topic = "profile"
            from benchmarks.common import run_worker

            run_worker("create_topics", {"bootstrap": b.bootstrap, "topics": [[topic, args.partitions]]})
            warm = 3.0
            producer = Worker("produce", {"bootstrap": b.bootstrap, "topic": topic, "partitions": args.partitions,
                                          "size": args.size, "acks": args.acks, "duration": args.duration + 2,
                                          "warmup": warm, "conf": {"enable.idempotence": args.idempotent}})
            time.sleep(warm + 1.0)
            assert b.serve.proc is not None
            pids = [p for p in broker_pids(b.serve.proc.pid)
                    if _label(p) not in ("IDLE",) and (_cmdline(p)[0].startswith("ray::") or p == b.serve.proc.pid)]
            pids = [p for p in pids if not _label(p).endswith("Agent")]
            every = broker_pids(b.serve.proc.pid)
            weed = ctx.seaweed().pid if args.backend == "seaweedfs" else None
            cpu0 = {p: _cpu_s(p) for p in [*every, producer.proc.pid, *([weed] if weed else [])]}
            m0 = b.metrics()
            load0 = loadavg()
            t0 = time.monotonic()
            spies = []
            for pid in [] if args.cpu_only else pids:
                raw = out / f"{_label(pid)}-{pid}.txt"
                cmd = [pyspy, "record", "--pid", str(pid), "--duration", str(int(args.duration)), "--rate",
                       str(args.rate), "--format", "raw", "--threads", "--output", str(raw)]
                if not args.blocking:
                    cmd.append("--nonblocking")
                if args.native:
                    cmd.append("--native")
                spies.append((pid, raw, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
            for _, _, spy in spies:
                spy.wait(args.duration + 120)
            if args.cpu_only:
                time.sleep(args.duration)
            window = time.monotonic() - t0
            cpu1 = {p: _cpu_s(p) for p in cpu0}
            report["broker_metrics"] = metrics_delta(m0, b.metrics())
            result = producer.result(300)
            result["latency"].pop("hist", None)
            cpu = []
            for p, c0 in cpu0.items():
                c1 = cpu1.get(p)
                if c0 is not None and c1 is not None and c1 - c0 > 0.05:
                    label = ("client (confluent-kafka producer)" if p == producer.proc.pid
                             else "S3 server (weed mini)" if p == weed else _label(p))
                    cpu.append({"pid": p, "process": label, "cpu_s": round(c1 - c0, 2),
                                "cores": round((c1 - c0) / window, 3)})
            cpu.sort(key=lambda x: -x["cpu_s"])
            report.update({"window_s": round(window, 1), "loadavg": [load0, loadavg()], "producer": result,
                           "cpu": cpu})
            summaries = {}
            for pid, raw, spy in spies:
                err = spy.stderr.read().decode(errors="replace") if spy.stderr else ""
                if not raw.exists():
                    log(f"py-spy on {pid} wrote nothing: {err[-500:]}")
                    continue
                summaries[raw.stem] = summarize(raw)
                to_speedscope(raw, out / f"{raw.stem}.speedscope.json", raw.stem)
            report["profiles"] = summaries
    finally:
        ctx.close()
        shutil.rmtree(ctx.work, ignore_errors=True)
    (out / "cpu.json").write_text(json.dumps(report, indent=1))
    (out / "profile.md").write_text(render(report))
    print(json.dumps({"out": str(out), "producer_mib_s": report.get("producer", {}).get("mib_per_s"),
                      "cpu": report.get("cpu")}, indent=1))
    return 0


def render(report: dict[str, Any]) -> str:
    lines = [f"# py-spy profile ({report['settings']})", ""]
    prod = report.get("producer", {})
    lines.append(f"Producer: {prod.get('mib_per_s', 0):.1f} MiB/s, {prod.get('records_per_s', 0):,.0f} records/s, "
                 f"client CPU {prod.get('client_cpu_fraction', 0):.2f} core, "
                 f"{prod.get('queue_full_waits', 0):,} waits on a full client queue, "
                 f"latency {prod.get('latency')}; load average {report.get('loadavg')}")
    lines += ["", "## Broker histograms over the window (count, mean)", ""]
    for name, labels in report.get("broker_metrics", {}).items():
        for label, v in labels.items():
            lines.append(f"- `{name}` [{label}]: " + ", ".join(f"{k} {val:,.2f}" for k, val in v.items()))
    lines += ["", "## CPU by process over the window", "", "| process | pid | CPU s | cores |", "|---|---|---|---|"]
    for c in report.get("cpu", []):
        lines.append(f"| {c['process']} | {c['pid']} | {c['cpu_s']} | {c['cores']} |")
    for name, s in report.get("profiles", {}).items():
        total = s["samples"] or 1
        lines += ["", f"## {name}: {s['samples']} active samples ({s.get('idle_samples', 0)} idle dropped;"
                  f" {report['settings']['rate']} samples/s per thread)", "", "Active samples by thread: " + ", ".join(
            f"{t} {100 * c / total:.0f}%" for t, c in s["threads"]), "", "| self % | function |", "|---|---|"]
        lines += [f"| {100 * c / total:.1f} | `{fn}` |" for fn, c in s["self"]]
        lines += ["", "| inclusive % | function |", "|---|---|"]
        lines += [f"| {100 * c / total:.1f} | `{fn}` |" for fn, c in s["inclusive"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
