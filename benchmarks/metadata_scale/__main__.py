"""`python -m benchmarks.metadata_scale [--quick] [--shards 1,2,4] …`: one run, printed as one JSON object; with
`--worker KIND JSON` (what the harness starts), one worker process instead."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import benchmarks.metadata_scale as package
from benchmarks.metadata_scale.commit_load import commit_worker, sequential_worker
from benchmarks.metadata_scale.run import measure
from benchmarks.metadata_scale.settings import CLIENT_PROCS, FLUSH_MS, PARTITIONS_PER_TXN
from benchmarks.metadata_scale.watch_fanout import watch_worker
from benchmarks.metadata_scale.worker_process import serve

WORKERS = {"commit": commit_worker, "watch": watch_worker, "sequential": sequential_worker}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.metadata_scale",
                                     description=(package.__doc__ or "").split("\n")[0])
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
        serve(WORKERS[args.worker[0]], json.loads(args.worker[1]))
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
