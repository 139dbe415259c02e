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

Where each part is (benchmarks/metadata_scale/):

- settings.py: the defaults of the sweep, the saturation rule and the clock all processes share;
- worker_process.py: both ends of a worker process (JSON lines out, the start time in);
- commit_load.py: what the simulated shards send, in the workers ("window", "batcher", sequential limits);
- commit_sweep.py: one step of the commit sweep, from the harness, and its figures;
- watch_fanout.py: the watchers (in the workers), the writer and one fan-out case;
- etcd_probes.py: the etcd under test seen from the harness (/metrics, version, clearing a step's keys);
- run.py: `measure`, one whole run against an etcd of its own;
- scenario.py: `metadata_scale`, that run as Results of `python -m benchmarks`;
- __main__.py: the command line above, and `--worker KIND JSON`.
"""

from benchmarks.metadata_scale.run import measure
from benchmarks.metadata_scale.scenario import metadata_scale

__all__ = ["measure", "metadata_scale"]
