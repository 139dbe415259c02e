"""How long a 10-member consumer group takes to become stable after its last member joins (target: 1 s).

Starts its own broker (`kafscale serve`, two shards on Ray, embedded stores) and a 20-partition topic. Nine
confluent-kafka members join and settle; then, for each run, a tenth member joins and the clock runs until

* the coordinator reports the group Stable with all ten members (DescribeGroups, polled every 5 ms), and
* every member's client holds its assignment (two partitions each).

The tenth member then leaves (LeaveGroup) and the group settles again before the next run. Existing members learn
of a rebalance from their next heartbeat, as in Kafka, so the heartbeat interval is a floor under the figure; it
is reported with it.

    python -m benchmarks.group_rebalance [--runs N] [--heartbeat-interval-ms MS]

Prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from kafscale.protocol import FrameBuffer, decode_response, encode_request, make, request_class
from kafscale.testing.serve_process import ServeProcess

MEMBERS, PARTITIONS, TARGET_S = 10, 20, 1.0
CLIENT_DEFAULT_HEARTBEAT_MS = 3000
DESCRIBE_GROUPS = 15
FIND_COORDINATOR = 10


class Group:
    def __init__(self, bootstrap: str, topic: str, group: str, heartbeat_ms: int) -> None:
        self.config = {"bootstrap.servers": bootstrap, "group.id": group, "session.timeout.ms": 10_000,
                       "heartbeat.interval.ms": heartbeat_ms, "partition.assignment.strategy": "range"}
        self.topic = topic
        self.members: list[Consumer] = []

    def add(self) -> None:
        c = Consumer(self.config)
        c.subscribe([self.topic])
        self.members.append(c)

    def remove(self) -> None:
        self.members.pop().close()

    def poll(self) -> None:
        for c in self.members:
            c.poll(0)  # serves rebalance callbacks: assignments change only here

    def all_assigned(self) -> bool:
        parts = [tp.partition for c in self.members for tp in c.assignment()]
        return sorted(parts) == list(range(PARTITIONS)) and all(c.assignment() for c in self.members)


class Coordinator:
    """A raw connection to the group's coordinator shard, for DescribeGroups (clients do not expose the state)."""

    def __init__(self, serve: ServeProcess, group: str) -> None:
        self.group = group
        self.frames = FrameBuffer()
        self.corr = 0
        self.sock = socket.create_connection(("127.0.0.1", serve.ports[0]), timeout=10)
        found = self._ask(FIND_COORDINATOR, 1, make(request_class(FIND_COORDINATOR, 1), key=group, key_type=0))
        self.sock.close()
        self.sock = socket.create_connection((found.host, found.port), timeout=10)

    def _ask(self, api: int, version: int, request: Any) -> Any:
        self.corr += 1
        self.sock.sendall(encode_request(request, self.corr, "bench"))
        ready: list[bytes] = []
        while not ready:
            ready = self.frames.feed(self.sock.recv(1 << 16))
        return decode_response(api, version, ready[0])[1]

    def stable_members(self) -> int:
        """Members of the group if the coordinator says it is Stable, else -1."""
        request = make(request_class(DESCRIBE_GROUPS, 5), groups=(self.group,), include_authorized_operations=False)
        described = self._ask(DESCRIBE_GROUPS, 5, request).groups[0]
        return len(described.members) if described.group_state == "Stable" else -1

    def close(self) -> None:
        self.sock.close()


def wait(condition: Any, timeout: float, what: str, group: Group) -> float:
    start = time.perf_counter()
    while not condition():
        group.poll()
        if time.perf_counter() - start > timeout:
            raise TimeoutError(what)
        time.sleep(0.005)
    return time.perf_counter()


def run_group(serve: ServeProcess, name: str, runs: int, heartbeat_ms: int) -> dict[str, Any]:
    group = Group(serve.bootstrap, "rebalance", name, heartbeat_ms)
    coordinator = Coordinator(serve, name)
    try:
        for _ in range(MEMBERS - 1):
            group.add()
        wait(lambda: coordinator.stable_members() == MEMBERS - 1 and group.all_assigned(), 120,
             "nine members settling", group)
        stable, assigned = [], []
        for _ in range(runs):
            joined = time.perf_counter()
            group.add()
            stable.append(wait(lambda: coordinator.stable_members() == MEMBERS, 60, "ten stable", group) - joined)
            assigned.append(wait(group.all_assigned, 60, "ten members assigned", group) - joined)
            group.remove()
            wait(lambda: coordinator.stable_members() == MEMBERS - 1 and group.all_assigned(), 60,
                 "back to nine", group)
    finally:
        while group.members:
            group.remove()
        coordinator.close()
    return {"heartbeat_interval_ms": heartbeat_ms,
            "stable_after_last_join_s": {"median": round(statistics.median(stable), 4),
                                         "max": round(max(stable), 4), "all": [round(x, 4) for x in stable]},
            "assigned_after_last_join_s": {"median": round(statistics.median(assigned), 4),
                                           "max": round(max(assigned), 4)}}


def measure(runs: int, heartbeat_ms: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kafscale-bench-groups-") as tmp:
        serve = ServeProcess(Path(tmp) / "data", shards=2)
        serve.start()
        try:
            admin = AdminClient({"bootstrap.servers": serve.bootstrap})
            admin.create_topics([NewTopic("rebalance", PARTITIONS, 1)])["rebalance"].result(30)
            main_run = run_group(serve, "bench-rebalance", runs, heartbeat_ms)
            # Context: the clients' default heartbeat interval (3 s in librdkafka and the Java client) is the
            # floor of any broker's figure, Kafka's included.
            default_run = run_group(serve, "bench-rebalance-defaults", max(runs // 2, 1), CLIENT_DEFAULT_HEARTBEAT_MS)
        finally:
            serve.kill()
    median = main_run["stable_after_last_join_s"]["median"]
    return {
        "benchmark": "group_rebalance",
        "members": MEMBERS, "partitions": PARTITIONS, "runs": runs, "client": "confluent-kafka",
        **main_run,
        "target": {"kind": "target", "value": TARGET_S, "unit": "s", "better": "lower"},
        "ratio_to_target": round(median / TARGET_S, 3),
        "meets_target": median <= TARGET_S,
        # What the broker adds on top of the wait for the members' next heartbeat (runs are phase-aligned
        # with the heartbeat timers, so that wait is about one whole interval).
        "beyond_one_heartbeat_interval_s": round(median - heartbeat_ms / 1000, 4),
        "with_client_default_heartbeat": default_run,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--heartbeat-interval-ms", type=int, default=500)
    args = parser.parse_args()
    result = measure(args.runs, args.heartbeat_interval_ms)
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
