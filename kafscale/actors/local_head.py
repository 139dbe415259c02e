"""A private local Ray head for `kafscale serve`, in its own session, that dies with the broker.

`ray.init()` would start Ray's processes in our process group, so the terminal's Ctrl-C (sent to
the whole group) would kill the shards before they could flush. We start the head with
`ray start --head` in a new session instead, stop it ourselves on shutdown, and leave a watchdog
that ends that session if this process is killed outright (kill -9), so no shard outlives it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kafscale.net import free_port

log = logging.getLogger(__name__)

STARTUP_TIMED_OUT = "timed out during startup"  # ray start, when its raylet did not register within 30 s


def ray_environment() -> dict[str, str]:
    env = dict(os.environ)
    # Ray binds to the external interface unless both the flag and node IP 127.0.0.1 are given.
    env.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    env.setdefault("RAY_AUTH_MODE", "disabled")
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray starts its workers, our shards among them, at nice 15: any ordinary process on the machine (the
    # client producing into them, a build) then takes the CPU first, and a busy machine starved the shards of
    # seconds at a time. The shards are the service here: they run at the niceness of Ray's own daemons.
    env.setdefault("RAY_worker_niceness", "0")
    return env


class LocalRayHead:
    def __init__(self, num_cpus: int | None = None, *, dashboard_port: int = 0, detached: bool = False) -> None:
        self.num_cpus = num_cpus or os.cpu_count() or 1
        self.dashboard_port = dashboard_port  # 0: no dashboard
        self.detached = detached  # outlives the command that started it: no watchdog
        self.port = 0
        self.pgid = 0
        self._watchdog: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> str:
        """Start the head; once more on a fresh port if Ray gave up waiting for its own raylet, which it does
        after a fixed 30 s (a busy machine: a build, another broker's start)."""
        try:
            return self._start()
        except RuntimeError as e:
            if STARTUP_TIMED_OUT not in str(e):
                raise
            log.warning("ray start timed out waiting for its raylet; starting the head again: %s", e)
            return self._start()

    def _start(self) -> str:
        self.port = free_port()
        ray_bin = Path(sys.executable).with_name("ray")
        env = ray_environment()
        os.environ.update({k: env[k] for k in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_AUTH_MODE",
                                               "RAY_USAGE_STATS_ENABLED", "RAY_worker_niceness")})
        dashboard = ["--include-dashboard=false"]
        if self.dashboard_port:
            dashboard = ["--include-dashboard=true", "--dashboard-host=127.0.0.1",
                         f"--dashboard-port={self.dashboard_port}"]
        starter = subprocess.Popen(
            [str(ray_bin), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={self.port}", *dashboard,
             "--disable-usage-stats", f"--num-cpus={self.num_cpus}"],
            env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        self.pgid = starter.pid  # session leader: Ray's daemons keep this process group
        if not self.detached:
            self._watchdog = subprocess.Popen(
                [sys.executable, "-m", "kafscale.actors.local_head", str(os.getpid()), str(self.pgid)],
                start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
        _, err = starter.communicate(timeout=120)
        if starter.returncode != 0:
            self.stop()
            raise RuntimeError(f"ray start failed: {err.decode(errors='replace')[-2000:]}")
        return self.address

    def stop(self) -> None:
        if self.pgid:
            _end_group(self.pgid)
            self.pgid = 0
        if self._watchdog is not None:
            self._watchdog.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._watchdog.wait(5)
            self._watchdog = None


def end_session(pgid: int) -> None:
    """End a detached local head's processes (`kafscale cluster stop`)."""
    _end_group(pgid)


def _end_group(pgid: int, grace: float = 1.0) -> None:
    # Ray's daemons (gcs_server, raylet, its agents) outlast SIGTERM by more than 5 s, so a longer grace only
    # delays every stop by its whole length. Nothing of ours needs it: a clean stop has stopped the shards
    # first, after a kill -9 they are lost anyway, and a private head's own state is thrown away.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _watch(parent: int, pgid: int) -> None:
    """Runs in its own process: when the broker process is gone, end Ray's session."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        try:
            os.kill(parent, 0)
        except ProcessLookupError:
            _end_group(pgid)
            return
        time.sleep(0.2)


if __name__ == "__main__":
    _watch(int(sys.argv[1]), int(sys.argv[2]))
