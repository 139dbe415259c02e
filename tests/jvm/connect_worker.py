"""A Kafka Connect distributed worker (`org.apache.kafka.connect.cli.ConnectDistributed`, Connect 4.3.1 from
Maven: tests/jvm/pom.xml's connect profile copies it into lib/connect-4.3.1/) as a process the tests start, talk
to over its REST API, and stop. (4.3.1 rather than 4.4.0: Maven Central serves no connect-file 4.4.0, and
4.3.1's FileStream connectors do not load on the 4.4.0 runtime; see the pom.)

No code of ours runs in the JVM: Connect's own main class, its FileStream connectors and its JSON converter.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kafscale.testing.etcd_server import _die_with_parent_prefix
from kafscale.testing.kafka_reference import JVM_FLAGS, find_java
from kafscale.testing.ports import free_port
from tests.jvm.harness import LIB, POM

CONNECT_VERSION = "4.3.1"
MAIN = "org.apache.kafka.connect.cli.ConnectDistributed"


def connect_lib(version: str = CONNECT_VERSION) -> Path:
    folder = LIB / f"connect-{version}"
    if not (folder / f"connect-runtime-{version}.jar").is_file():
        raise FileNotFoundError(
            f"Kafka Connect {version} is not installed: {folder} holds no connect-runtime-{version}.jar. Install it "
            f"with `make reference-kafka` (which `make test` runs) or "
            f"`mvn -q -B -f {POM} -P connect-{version} dependency:copy-dependencies`"
        )
    return folder


class RestError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:2000]}")
        self.status = status
        self.body = body


class ConnectWorker:
    """One distributed worker: `start()` (a new JVM on a new REST port, the same worker.properties otherwise),
    `wait_ready()`, `rest(...)`, `stop()` (SIGTERM, then SIGKILL after a timeout). Each run logs (slf4j-simple:
    Connect's INFO, everything else's WARN) to worker-<n>.log in workdir; `log()` gives its tail."""

    def __init__(self, bootstrap: str, group: str, workdir: Path, extra: Mapping[str, str] | None = None,
                 version: str = CONNECT_VERSION) -> None:
        self.lib = connect_lib(version)
        self.java = find_java()
        self.bootstrap = bootstrap
        self.group = group
        self.workdir = workdir
        self.extra = dict(extra or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.runs = 0

    def properties(self) -> dict[str, str]:
        converter = "org.apache.kafka.connect.json.JsonConverter"
        return {
            "bootstrap.servers": self.bootstrap,
            "group.id": self.group,
            "config.storage.topic": f"{self.group}-configs",
            "offset.storage.topic": f"{self.group}-offsets",
            "status.storage.topic": f"{self.group}-status",
            "config.storage.replication.factor": "-1",  # the broker's default
            "offset.storage.replication.factor": "-1",
            "status.storage.replication.factor": "-1",
            "key.converter": converter,
            "value.converter": converter,
            "key.converter.schemas.enable": "false",
            "value.converter.schemas.enable": "false",
            # no plugin.path: the plugins on the classpath, found by their META-INF/services manifests (every jar of
            # Connect has them; scanning the classpath instead, only_scan, takes 11 s on 2 cores)
            "plugin.discovery": "service_load",
            "offset.flush.interval.ms": "500",
            "scheduled.rebalance.max.delay.ms": "0",  # a lost assignment is given out again at once
            "listeners": f"http://127.0.0.1:{self.port}",
            "rest.advertised.host.name": "127.0.0.1",
            "rest.advertised.port": str(self.port),
            **self.extra,
        }

    @property
    def log_path(self) -> Path:
        return self.workdir / f"worker-{self.runs}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ConnectWorker:
        assert not self.alive(), "already running"
        self.runs += 1
        self.port = free_port()
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / f"worker-{self.runs}.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in self.properties().items()))
        # setpriv --pdeathsig: the JVM dies with the test process if that is killed before it stops the worker
        command = [*_die_with_parent_prefix(), self.java, *JVM_FLAGS, f"-Djava.io.tmpdir={self.workdir}",
                   "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                   "-Dorg.slf4j.simpleLogger.log.org.apache.kafka.connect=info",
                   "-Dorg.slf4j.simpleLogger.showDateTime=true",
                   "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
                   "-cp", f"{self.lib}/*", MAIN, str(config)]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=self.workdir, start_new_session=True)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Until GET /health answers 200: the worker has joined its group and read its internal topics."""
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            if not self.alive():
                assert self.proc is not None
                raise AssertionError(f"the Connect worker exited with {self.proc.returncode}:\n{self.log()}")
            try:
                self.rest("GET", "/health", timeout=5)
                return
            except (RestError, OSError) as e:
                last = str(e)
            if time.monotonic() > deadline:
                raise AssertionError(f"the Connect worker was not ready in {timeout:.0f}s ({last}):\n{self.log()}")
            time.sleep(0.3)

    def rest(self, method: str, path: str, body: Any = None, timeout: float = 30.0) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as e:
            raise RestError(e.code, e.read().decode(errors="replace")) from None
        return json.loads(text) if text else None

    def rest_retrying(self, method: str, path: str, body: Any = None, timeout: float = 60.0) -> Any:
        """rest(), again while the worker answers 409 (a rebalance, or a config change not yet read back) or 5xx
        (the herder busy)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.rest(method, path, body)
            except RestError as e:
                if (e.status != 409 and e.status < 500) or time.monotonic() > deadline:
                    raise AssertionError(f"{method} {path}: {e}\n{self.log()}") from None
            time.sleep(0.2)

    def put_connector(self, name: str, config: Mapping[str, str]) -> Any:
        return self.rest_retrying("PUT", f"/connectors/{name}/config", dict(config))

    def wait_running(self, name: str, tasks: int = 1, timeout: float = 60.0) -> dict[str, Any]:
        """GET /connectors/NAME/status until the connector and its `tasks` tasks are RUNNING; a FAILED one fails."""
        deadline = time.monotonic() + timeout
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            with contextlib.suppress(RestError):
                status = self.rest("GET", f"/connectors/{name}/status")
                states = [status["connector"]["state"], *(t["state"] for t in status["tasks"])]
                if "FAILED" in states:
                    raise AssertionError(f"{name} failed: {status}\n{self.log()}")
                if len(status["tasks"]) == tasks and set(states) == {"RUNNING"}:
                    return status
            time.sleep(0.3)
        raise AssertionError(f"{name} not RUNNING with {tasks} tasks in {timeout:.0f}s: {status}\n{self.log()}")

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (Connect stops its connectors, commits their offsets and leaves its group), then SIGKILL if
        the JVM is still there after timeout."""
        if not self.alive():
            return
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def log(self, chars: int = 8000) -> str:
        text = ""
        for path in sorted(self.workdir.glob("worker-*.log")):
            text += f"--- {path}:\n{path.read_text(errors='replace')[-chars:]}\n"
        return text
