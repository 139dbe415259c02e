"""Both ends of a worker process: `python -m benchmarks.metadata_scale --worker KIND JSON`.

A worker prints JSON lines on stdout ({"ready": true} once set up, its result last), waits for the start time
the harness sends on stdin ("go"), and runs on uvloop like the shard actors. The harness holds it as a Child.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from benchmarks.common import REPO

# -- in the worker ------------------------------------------------------------------------------------------------


def emit(obj: dict[str, Any]) -> None:
    # Straight to the file descriptor: after uvloop.run, writes through sys.stdout beyond one pipe's worth
    # (64 KiB) were lost without an error, and the results of a busy step are larger than that.
    data = (json.dumps(obj) + "\n").encode()
    os.set_blocking(1, True)
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


async def wait_go() -> float:
    """The start time the harness sends on stdin once every worker is ready."""
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    return float(line)


def serve(fn: Callable[[dict[str, Any]], Coroutine[Any, Any, dict[str, Any]]], params: dict[str, Any]) -> None:
    """Run one worker function to its result and emit that."""
    try:
        import uvloop  # the shard actors' loop (docs/performance.md, "Process settings")

        result = uvloop.run(fn(params))
    except ImportError:
        result = asyncio.run(fn(params))
    emit(result)


# -- in the harness -----------------------------------------------------------------------------------------------


class Child:
    """`python -m benchmarks.metadata_scale --worker KIND JSON`: JSON lines on stdout, "go" on stdin."""

    def __init__(self, kind: str, params: dict[str, Any], log_dir: Path) -> None:
        self.kind = kind
        self.err_path = log_dir / f"worker-{kind}-{os.getpid()}-{time.monotonic_ns()}.stderr"
        with open(self.err_path, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.metadata_scale", "--worker", kind,
                                          json.dumps(params)], cwd=REPO, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err, text=True)

    def _stderr(self) -> str:
        with contextlib.suppress(OSError):
            return self.err_path.read_text()[-3000:]
        return ""

    def line(self, timeout: float) -> dict[str, Any] | None:
        """The next JSON line, or None if none came within timeout."""
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        text = self.proc.stdout.readline()
        if not text:
            raise RuntimeError(f"worker {self.kind} exited ({self.proc.wait()}): {self._stderr()}")
        return json.loads(text)

    def go(self, t0: float) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{t0!r}\n")
        self.proc.stdin.flush()

    def result(self, timeout: float) -> dict[str, Any]:
        got = self.line(timeout)
        if got is None:
            raise TimeoutError(f"worker {self.kind}: no result within {timeout}s: {self._stderr()}")
        self.proc.wait(30)
        return got

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(OSError):
            self.err_path.unlink()
