"""A multi-node Ray cluster on this one machine, every node on 127.0.0.1, for tests and benchmarks.

Ray's own test helper (ray.cluster_utils.Cluster) starts each node's daemons from this process without
making it a driver, so a `kafscale serve` child process can join the cluster with --ray-address. Killing
a node SIGKILLs its daemons and the worker processes it started, as a machine's loss would.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kafscale.actors.local_head import STARTUP_TIMED_OUT

if TYPE_CHECKING:
    from kafscale.testing.netns import TestHost

NODE_MEMORY = 80 * 1024 * 1024  # object store per node: the broker passes little through it


def _ray_env() -> None:
    # Read when Ray starts processes: loopback only, no token files, no usage reports.
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_worker_niceness", "0")  # as `kafscale serve`'s own head (actors/local_head.py)


class RayTestCluster:
    def __init__(self, nodes: int = 3, cpus_per_node: int = 1, ip: str = "127.0.0.1") -> None:
        self.nodes = nodes
        self.cpus = cpus_per_node
        self.ip = ip  # loopback, or the root side of a test network (kafscale.testing.netns)
        self.cluster: Any = None
        self._state: Any = None  # one GCS client for alive_nodes(), closed by stop()
        self._outside: list[subprocess.Popen[bytes]] = []

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def start(self) -> RayTestCluster:
        _ray_env()
        from ray.cluster_utils import Cluster

        args = {"node_ip_address": self.ip, "num_cpus": self.cpus, "object_store_memory": NODE_MEMORY}
        self.cluster = Cluster(initialize_head=True, connect=False, head_node_args={**args, "include_dashboard": False})
        for _ in range(self.nodes - 1):
            self.add_node()
        return self

    def add_node(self, **labels: str) -> str:
        node = self.cluster.add_node(node_ip_address=self.ip, num_cpus=self.cpus, object_store_memory=NODE_MEMORY,
                                     labels=labels or None)
        return str(node.node_id)

    def add_node_in(self, host: TestHost, timeout: float = 90, attempts: int = 3) -> None:
        """A node inside a test host's network namespace, at its own IP (`ray start`: Ray's test helper can
        only start nodes in this namespace). It ends with stop(). Started again if `ray start` gave up waiting
        for its raylet (Ray's fixed 30 s, exceeded on a busy machine): a loaded run saw it give up twice."""
        for attempt in range(attempts):
            try:
                self._start_node_in(host, timeout)
                return
            except RuntimeError as e:
                if STARTUP_TIMED_OUT not in str(e) or attempt == attempts - 1:
                    raise

    def _start_node_in(self, host: TestHost, timeout: float) -> None:
        env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="1")  # `ray start` refuses to join otherwise
        ray_bin = str(Path(sys.executable).with_name("ray"))
        command = host.command(ray_bin, "start", f"--address={self.address}", f"--node-ip-address={host.node_ip}",
                               f"--num-cpus={self.cpus}", f"--object-store-memory={NODE_MEMORY}", "--block",
                               "--disable-usage-stats")
        with tempfile.TemporaryFile() as errors:  # the node keeps its own copy of the descriptor
            proc = subprocess.Popen(command, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                                    stderr=errors)
            self._outside.append(proc)
            deadline = time.monotonic() + timeout
            while not any(n["NodeManagerAddress"] == host.node_ip and n["Alive"] for n in self.alive_nodes()):
                if proc.poll() is not None or time.monotonic() > deadline:
                    errors.seek(0)
                    said = errors.read().decode(errors="replace")[-1500:]
                    state = "exited" if proc.poll() is not None else "still running"
                    raise RuntimeError(f"the Ray node in {host.name} did not join within {timeout:.0f}s (ray start "
                                       f"{state}): {said}")
                time.sleep(0.5)

    def kill_nodes_in(self, host: TestHost) -> None:
        """SIGKILL the Ray node inside a test host: its daemons and workers share the `ray start` session."""
        for proc in [p for p in self._outside if host.name in p.args]:  # type: ignore[operator]
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            self._outside.remove(proc)

    def alive_nodes(self) -> list[dict[str, Any]]:
        """Ray's node table, read from the GCS without becoming a driver."""
        if self._state is None:
            from ray._private.state import GlobalState
            from ray._raylet import GcsClientOptions

            self._state = GlobalState()
            self._state._initialize_global_state(GcsClientOptions.create(
                self.address, None, allow_cluster_id_nil=True, fetch_cluster_id_if_nil=False))
        return [n for n in self._state.node_table() if n["Alive"]]

    def resource_request(self) -> list[dict[str, float]]:
        """What was last asked of Ray's autoscaler (`ray.autoscaler.sdk.request_resources`): the bundles the
        autoscaler (v1, Ray's default) reads from the GCS key-value store, where the request is kept."""
        from ray._raylet import GcsClient

        raw = GcsClient(address=self.address).internal_kv_get(b"autoscaler_resource_request", None)
        return list(json.loads(raw)) if raw else []

    def node_ids(self) -> list[str]:
        return [str(n.node_id) for n in self.cluster.list_all_nodes()]

    def head_id(self) -> str:
        return str(self.cluster.head_node.node_id)

    def kill_node(self, node_id: str) -> list[int]:
        """SIGKILL a worker node: its daemons and every worker process its raylet started. Returns the pids."""
        node = next(n for n in self.cluster.worker_nodes if n.node_id == node_id)
        raylet = node.all_processes["raylet"][0].process.pid
        victims = [raylet, *_descendants(raylet)]
        victims += [p.process.pid for infos in node.all_processes.values() for p in infos]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.cluster.remove_node(node, allow_graceful=False)
        return victims

    def stop(self) -> None:
        for proc in self._outside:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        self._outside.clear()
        if self.cluster is not None:
            # GCS clients are closed while their GCS still runs: one left to a later garbage collection
            # tears down its C++ threads at a random point of a later test.
            for state in (self._state, self.cluster.global_state):
                if state is not None:
                    with contextlib.suppress(Exception):
                        state.disconnect()
            self._state = None
            with contextlib.suppress(Exception):
                self.cluster.shutdown()
            self.cluster = None

    def __enter__(self) -> RayTestCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = open(f"/proc/{entry}/stat").read()  # noqa: SIM115 - /proc reads are one-shot
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def wait_until(predicate: Any, timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
