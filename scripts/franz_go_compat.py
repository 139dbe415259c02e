#!/usr/bin/env python3
"""franz-go's own tests (pkg/kgo) against kafscale and against Apache Kafka 4.4.0: `make compat`.

franz-go's kgo tests talk to whatever broker KGO_SEEDS names (its integration tests: producing, consuming, groups,
transactions, share groups, ...; the rest are unit tests that need none). This takes franz-go's module source at
the version tests/clients/go/go.mod pins from the Go module cache (`go mod download`; the tests are in the module
zip), builds the test binary once, and runs it against

* `kafscale serve` (Ray, --shards-per-node N, the embedded stores in a temporary directory, 127.0.0.1, free ports),
* Apache Kafka 4.4.0 (kafscale.testing.kafka_reference, one KRaft node),

with KGO_TEST_RF=1 (one broker's worth of replicas) and KGO_TEST_RECORDS records for the tests that stream many.
It prints each run's pass / fail / skip counts of the top-level tests, and the tests that fail on kafscale but pass
on Kafka; each run's full output is kept in --out (default build/compat/). docs/compatibility.md ("franz-go's
integration suite") records a run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GO_MODULE = REPO / "tests" / "clients" / "go"
FRANZ = "github.com/twmb/franz-go"
RESULT = re.compile(r"^--- (PASS|FAIL|SKIP): (\S+) \(([\d.]+)s\)")


def go(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(["go", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"go {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def franz_source(work: Path) -> tuple[str, Path]:
    """franz-go's version as go.mod pins it, and a writable copy of its module source (the module cache's is
    read-only, and `go test` writes nothing there but wants a module it may resolve)."""
    version = go("list", "-m", "-f", "{{.Version}}", FRANZ, cwd=GO_MODULE).strip()
    info = json.loads(go("mod", "download", "-json", f"{FRANZ}@{version}", cwd=GO_MODULE))
    copy = work / f"franz-go@{version}"
    shutil.copytree(info["Dir"], copy)
    for root, dirs, files in os.walk(copy):
        for name in dirs + files:
            path = Path(root) / name
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
    return version, copy


def build_tests(source: Path, work: Path) -> Path:
    binary = work / "kgo.test"
    env = dict(os.environ, GOFLAGS="-mod=mod")
    go("test", "-c", "-o", str(binary), "./pkg/kgo", cwd=source, env=env)
    return binary


def run_tests(binary: Path, source: Path, seeds: str, args: argparse.Namespace, log: Path) -> dict[str, str]:
    """Runs the kgo tests against seeds; top-level test name -> PASS / FAIL / SKIP (a test still running when the
    binary's timeout struck, or when it crashed, counts as FAIL)."""
    env = dict(os.environ, KGO_SEEDS=seeds, KGO_TEST_RF="1", KGO_TEST_RECORDS=str(args.records),
               KGO_LOG_LEVEL=args.log_level)
    cmd = [str(binary), "-test.v", f"-test.timeout={args.timeout}", "-test.count=1"]
    if args.run:
        cmd.append(f"-test.run={args.run}")
    began = time.monotonic()
    with log.open("w") as out:
        code = subprocess.run(cmd, cwd=source / "pkg" / "kgo", env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    results: dict[str, str] = {}
    started: list[str] = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("=== RUN   ") and "/" not in line:
            started.append(line.split()[-1])
        found = RESULT.match(line)  # top-level results only: subtests' lines are indented
        if found:
            results[found.group(2)] = found.group(1)
    for name in started:
        results.setdefault(name, "FAIL")  # began and never ended: the timeout's panic or a crash
    print(f"  ran in {time.monotonic() - began:.0f} s, exit {code}; output: {log}", flush=True)
    return results


def counts(results: dict[str, str]) -> str:
    n = {k: sum(1 for v in results.values() if v == k) for k in ("PASS", "FAIL", "SKIP")}
    return f"{n['PASS']} passed, {n['FAIL']} failed, {n['SKIP']} skipped"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=20_000, help="KGO_TEST_RECORDS (franz-go's default: 500000)")
    parser.add_argument("--run", default="", help="only the tests matching this regexp (go test -run)")
    parser.add_argument("--timeout", default="20m", help="the test binary's timeout per broker")
    parser.add_argument("--shards", type=int, default=2, help="kafscale serve --shards-per-node")
    parser.add_argument("--log-level", default="none", help="KGO_LOG_LEVEL: none, info or debug")
    parser.add_argument("--out", type=Path, default=REPO / "build" / "compat", help="where the outputs are kept")
    parser.add_argument("--only", choices=("kafscale", "kafka"), help="run against one broker only")
    args = parser.parse_args()

    sys.path.insert(0, str(REPO))
    from kafscale.testing.kafka_reference import ReferenceKafka
    from kafscale.testing.serve_process import ServeProcess

    args.out.mkdir(parents=True, exist_ok=True)
    outcome: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="franz-compat-") as tmp:
        work = Path(tmp)
        version, source = franz_source(work)
        print(f"franz-go {version}: building pkg/kgo's tests", flush=True)
        binary = build_tests(source, work)

        if args.only in (None, "kafscale"):
            serve = ServeProcess(work / "kafscale-data", shards=args.shards, log_path=args.out / "kafscale-serve.log")
            print(f"kafscale serve, {args.shards} shards: starting", flush=True)
            with serve:
                print(f"kafscale serve at {serve.bootstrap_all}: running the tests", flush=True)
                outcome["kafscale"] = run_tests(binary, source, serve.bootstrap_all, args,
                                                args.out / "kgo-kafscale.log")
        if args.only in (None, "kafka"):
            print("Apache Kafka 4.4.0: starting", flush=True)
            with ReferenceKafka("4.4.0", parent_dir=work) as kafka:
                print(f"Apache Kafka 4.4.0 at {kafka.bootstrap}: running the tests", flush=True)
                outcome["kafka"] = run_tests(binary, source, kafka.bootstrap, args, args.out / "kgo-kafka-4.4.0.log")

    print(f"\nfranz-go {version} pkg/kgo tests (KGO_TEST_RECORDS={args.records}, KGO_TEST_RF=1"
          f"{', -run ' + args.run if args.run else ''}):")
    for name, results in outcome.items():
        print(f"  {'kafscale' if name == 'kafscale' else 'Apache Kafka 4.4.0'}: {counts(results)}")
    if len(outcome) == 2:
        ours, theirs = outcome["kafscale"], outcome["kafka"]
        only_ours = sorted(t for t, r in ours.items() if r == "FAIL" and theirs.get(t) == "PASS")
        both = sorted(t for t, r in ours.items() if r == "FAIL" and theirs.get(t) == "FAIL")
        only_theirs = sorted(t for t, r in theirs.items() if r == "FAIL" and ours.get(t) == "PASS")
        print(f"  fail on kafscale, pass on Kafka ({len(only_ours)}): {' '.join(only_ours) or '-'}")
        print(f"  fail on both ({len(both)}): {' '.join(both) or '-'}")
        print(f"  fail on Kafka only ({len(only_theirs)}): {' '.join(only_theirs) or '-'}")
    (args.out / "summary.json").write_text(json.dumps({"franz-go": version, "records": args.records,
                                                       "results": outcome}, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
