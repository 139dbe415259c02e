"""`make bench` entry point: `python -m benchmarks [--scenario NAME]... [--quick] [--out DIR]`.

Every run starts its own brokers (embedded local store and SeaweedFS), drives them from separate
client processes, and writes results.json plus PNG plots to the output folder (default
benchmarks/results/<timestamp>/). The limits (loopback TCP, raw store PUT/GET) are always measured
first, so every figure is reported beside a limit measured in the same run. A compact summary is
printed to stdout as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks import guard
from benchmarks.common import REPO, Context, log, machine_info, set_aside_cpus
from benchmarks.scenarios import SCENARIOS, close_shared, resolve

DEFAULT_ORDER = ["limits", "produce", "end_to_end", "kcat_spec", "catchup", "read_back", "transactions", "compaction",
                 "scale", "group_rebalance", "pipeline_read"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", action="append", default=[],
                        help=f"run only this scenario (repeatable): {', '.join(SCENARIOS)}; limits always run")
    parser.add_argument("--quick", action="store_true", help="short smoke run (small backlog, short windows)")
    parser.add_argument("--out", type=Path, help="results folder (default benchmarks/results/<timestamp>)")
    parser.add_argument("--backend", action="append", choices=["local", "seaweedfs"], default=[],
                        help="object store backends (repeatable; default both)")
    parser.add_argument("--duration", type=float, default=5.0, help="produce measuring window, seconds")
    parser.add_argument("--backlog-mib", type=int, help="catch-up backlog on the local store (default 2048)")
    parser.add_argument("--scale-partitions", type=int, action="append",
                        help="partition counts of the scale scenario (repeatable; default 1000 and 10000)")
    parser.add_argument("--e2e-rate", type=float, default=1000.0, help="end-to-end scenario rate, records/s")
    parser.add_argument("--soak-minutes", type=float, default=60.0, help="soak scenario length (default 60)")
    parser.add_argument("--keep-data", action="store_true", help="keep broker data under OUT/work")
    parser.add_argument("--s3-cpus", type=int, default=0,
                        help="run SeaweedFS on this many CPUs of its own and everything else on the rest "
                             "(default 0: all share every CPU)")
    parser.add_argument("--no-s3-own-cpu", action="store_true",
                        help="skip the second SeaweedFS produce pass with the S3 server on a CPU of its own")
    parser.add_argument("--save-release", action="store_true",
                        help="write this run's figures to benchmarks/release.json as the release's (at a release)")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    return parser.parse_args(argv)


def _sample_load(samples: list[list[float]], stop: threading.Event, t0: float) -> None:
    while not stop.wait(5.0):
        samples.append([round(time.monotonic() - t0, 1), round(os.getloadavg()[0], 2)])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        print("\n".join(SCENARIOS))
        return 0
    chosen = [resolve(s) for s in args.scenario] or list(DEFAULT_ORDER)
    # Named scenarios outside the default run (metadata_scale, cluster) run after the default ones.
    names = (["limits"] + [s for s in DEFAULT_ORDER if s in chosen and s != "limits"]
             + [s for s in chosen if s not in DEFAULT_ORDER])
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = (args.out or REPO / "benchmarks" / "results" / stamp).absolute()
    out.mkdir(parents=True, exist_ok=True)
    backends = args.backend or ["local", "seaweedfs"]
    options: dict[str, Any] = {"duration": args.duration, "backlog_mib": args.backlog_mib,
                               "scale_partitions": args.scale_partitions, "e2e_rate": args.e2e_rate,
                               "soak_minutes": args.soak_minutes}
    if args.s3_cpus:
        options["s3_cpus"], options["other_cpus"] = set_aside_cpus(args.s3_cpus)
    ctx = Context(out, args.quick, backends, options)
    log(f"results folder {out}; scenarios {names}; backends {backends}; quick={args.quick}")
    machine = machine_info()
    t0 = time.monotonic()
    samples: list[list[float]] = [[0.0, machine["loadavg_at_start"][0]]]
    stop = threading.Event()
    sampler = threading.Thread(target=_sample_load, args=(samples, stop, t0), daemon=True)
    sampler.start()
    failures: dict[str, str] = {}
    timings: dict[str, float] = {}
    try:
        for name in names:
            log(f"=== scenario {name}")
            s0 = time.monotonic()
            try:
                SCENARIOS[name](ctx)
            except Exception as exc:
                failures[name] = f"{type(exc).__name__}: {exc}"
                log(f"scenario {name} FAILED: {failures[name]}")
                traceback.print_exc(file=sys.stderr)
            timings[name] = round(time.monotonic() - s0, 1)
            _write(out, ctx, machine, args, names, samples, failures, timings, t0)
    finally:
        close_shared(ctx)
        ctx.close()
        stop.set()
        if not args.keep_data:
            shutil.rmtree(ctx.work, ignore_errors=True)
    if _wants_own_cpu_pass(args, backends, names):
        failures.update(_own_cpu_pass(out / "seaweedfs-own-cpu", args))
    data = _write(out, ctx, machine, args, names, samples, failures, timings, t0)
    try:
        from benchmarks.plots import plot_all

        plots = plot_all(out, data)
        log(f"plots: {', '.join(plots)}")
    except ImportError:
        log("matplotlib is not installed (pip install -e '.[bench]'): no plots drawn")
    summary = [{"scenario": r["scenario"], "name": r["name"], "backend": r["backend"], "value": r["value"],
                "unit": r["unit"], "load1": r["loadavg"][0],
                "ratios": {f"{x['kind']}:{x['description']}": x["ratio"] for x in r["references"]},
                "met": [x["met"] for x in r["references"] if x["kind"] == "target"]}
               for r in data["results"]]
    release = guard.load()
    compared = guard.compare(data["results"], args.quick, release)
    for line in guard.describe(compared, release, args.quick):
        log(line)
    if args.save_release:
        guard.save(data["results"], args.quick)
        log(f"release figures written to {guard.RELEASE}")
    print(json.dumps({"results_dir": str(out), "failures": failures, "summary": summary,
                      "release": {c.key: {"ratio": c.ratio, "drop": c.drop} for c in compared},
                      "drops": [c.key for c in compared if c.drop]}, indent=1))
    log(f"done in {time.monotonic() - t0:.0f} s; results in {out}")
    return 1 if failures else 0


def _wants_own_cpu_pass(args: argparse.Namespace, backends: list[str], names: list[str]) -> bool:
    return ("seaweedfs" in backends and "produce" in names and not args.s3_cpus and not args.quick
            and not args.no_s3_own_cpu and len(os.sched_getaffinity(0)) > 1)


def _own_cpu_pass(out: Path, args: argparse.Namespace) -> dict[str, str]:
    """The SeaweedFS produce figures again, with the S3 server on a CPU of its own (as S3 is on other
    machines in a deployment): its own results folder, limits measured beside it as always."""
    log(f"=== SeaweedFS on a CPU of its own: {out}")
    cmd = [sys.executable, "-m", "benchmarks", "--backend", "seaweedfs", "--s3-cpus", "1", "--scenario", "produce",
           "--duration", str(args.duration), "--out", str(out)]
    done = subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL, check=False)
    return {} if done.returncode == 0 else {"seaweedfs-own-cpu": f"exit status {done.returncode}; see {out}"}


def _write(out: Path, ctx: Context, machine: dict[str, Any], args: argparse.Namespace, names: list[str],
           samples: list[list[float]], failures: dict[str, str], timings: dict[str, float],
           t0: float) -> dict[str, Any]:
    data = {
        "machine": machine,
        "settings": {"argv": sys.argv[1:], "scenarios": names, "quick": args.quick, "backends": ctx.backends,
                     "options": {k: v for k, v in ctx.options.items() if not k.startswith("_")}},
        "limits": ctx.limits,
        "duration_s": round(time.monotonic() - t0, 1),
        "scenario_seconds": timings,
        "failures": failures,
        "loadavg_samples": samples,
        "note": "2-core machine shared with other work: see loadavg in every result",
        "results": [r.to_json() for r in ctx.results],
    }
    (out / "results.json").write_text(json.dumps(data, indent=1))
    return data


if __name__ == "__main__":
    sys.exit(main())
