"""`kafscale serve` as a child process, for end-to-end tests and benchmarks."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from kafscale.testing.etcd_server import _die_with_parent_prefix
from kafscale.testing.ports import free_port

# How long start() waits for "ready" unless told: see start(). A test that starts the broker gives itself this
# much per start beyond pytest's usual timeout for the rest of its work.
START_TIMEOUT_S = 300.0


class ServeProcess:
    def __init__(self, data_dir: str | Path, *, shards: int = 2, extra_args: list[str] | None = None,
                 ports: list[int] | None = None, log_path: str | Path | None = None,
                 listeners: dict[str, int] | None = None, env: dict[str, str] | None = None) -> None:
        """listeners: name -> first port, served as --listeners on 127.0.0.1 (shard k at PORT+k) instead of
        --listen and --shard-ports; `ports` are then the first listener's. env: added to this environment
        (KAFSCALE_UI_USERNAME and KAFSCALE_UI_PASSWORD, for one)."""
        self.data_dir = Path(data_dir)
        self.shards = shards
        self.listeners = listeners
        if listeners:
            first = next(iter(listeners.values()))
            ports = [first + k for k in range(shards)]
        self.ports = ports or [free_port() for _ in range(shards)]
        self.extra_args = extra_args or []
        self.env = env or {}
        self.log_path = Path(log_path) if log_path else self.data_dir.with_name(self.data_dir.name + "-serve.log")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.ports[0]}"

    @property
    def bootstrap_all(self) -> str:
        """Every shard port, as clients list several brokers: any one of them may be down."""
        return ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def start(self, timeout: float = START_TIMEOUT_S) -> ServeProcess:
        """Run `kafscale serve` and wait for its "ready". The default wait covers what the broker itself allows
        its start on a busy machine: `ray start` once more after Ray gave up on its own raylet (30 s, or a raylet
        that died waiting for its dashboard agent), then up to 120 s for the controller's shards. 120 s here ran
        out while a start was still on its way (a 2-core machine under two test workers and a benchmark)."""
        if self.listeners:
            where = ["--listeners", ",".join(f"{name}://127.0.0.1:{port}" for name, port in self.listeners.items())]
        else:
            where = ["--listen", self.bootstrap, "--shard-ports", ",".join(map(str, self.ports))]
        # Killed with the thread that starts it (PR_SET_PDEATHSIG; its Ray head's watchdog then ends the rest): a
        # test or benchmark killed from outside (a timeout, Ctrl-C) leaves no broker running.
        args = [*_die_with_parent_prefix(), sys.executable, "-m", "kafscale.cli", "serve", *where,
                "--shards-per-node", str(self.shards),
                "--no-dashboard",
                "--data-dir", str(self.data_dir), "--metrics-listen", "127.0.0.1:0", "--console-listen", "127.0.0.1:0",
                *self.extra_args]
        log = self.log_path.open("ab")
        seen = self.log_path.stat().st_size  # a restart appends: only its own "ready" counts
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, **self.env})
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"kafscale serve exited with {self.proc.returncode}; log: {self.log_path}"
                                       f"{self._tail(seen)}")
                if b" ready: " in self.log_path.read_bytes()[seen:]:
                    return self
                time.sleep(0.2)
        except BaseException:
            # pytest-timeout (or Ctrl-C) ending a long wait: a `with` block never reaches __exit__, and the
            # broker with its Ray head would outlive the test.
            with contextlib.suppress(Exception):  # the error to report is the one that ended the wait
                self.kill()
            raise
        self.kill()
        raise TimeoutError(f"kafscale serve not ready after {timeout}s; log: {self.log_path}{self._tail(seen)}")

    def _tail(self, since: int, lines: int = 20) -> str:
        """The end of this start's log, for a failure's message: the log lives in a temporary directory that
        pytest removes a few runs later."""
        text = self.log_path.read_bytes()[since:].decode(errors="replace").splitlines()[-lines:]
        return "".join(f"\n  {line}" for line in text)

    @property
    def console_url(self) -> str:
        """The console's address, as the last start logged it."""
        found = re.findall(r" console: (\S+) ", self.log_text())
        if not found:
            raise RuntimeError(f"kafscale serve logged no console address; log: {self.log_path}")
        return str(found[-1])

    def actor_pids(self, actor_class: str) -> list[int]:
        """The processes of this broker's own Ray head running an actor of that class: Ray's workers share the
        session of its `ray start`, which the head's watchdog names (other brokers on the machine have others)."""
        assert self.proc is not None
        # -ww: else ps cuts lines at $COLUMNS, which a test run may set, and the watchdog line lost its pids.
        table = subprocess.run(["ps", "-ww", "-eo", "pid=,sid=,args="], capture_output=True, text=True).stdout
        watchdog = re.search(rf"kafscale\.actors\.local_head {self.proc.pid} (\d+)", table)
        if watchdog is None:
            raise RuntimeError(f"serve pid {self.proc.pid} runs no private Ray head")
        rows = (line.split(None, 2) for line in table.splitlines())
        return [int(pid) for pid, sid, args in (r for r in rows if len(r) == 3)
                if sid == watchdog.group(1) and args.startswith(f"ray::{actor_class}")]

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """kill -9 of the serve process alone; its Ray runtime's watchdog ends the rest."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._wait_ports_free()

    def terminate(self, timeout: float = 90) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self._wait_ports_free()
        return code

    def _wait_ports_free(self, timeout: float = 30) -> None:
        import socket

        deadline = time.monotonic() + timeout
        for port in self.ports:
            while time.monotonic() < deadline:
                with contextlib.closing(socket.socket()) as s:
                    if s.connect_ex(("127.0.0.1", port)) != 0:
                        break
                time.sleep(0.2)

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.terminate()
            except Exception:
                self.kill()
