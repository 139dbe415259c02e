"""A throw-away Apache Kafka broker on 127.0.0.1: the reference that differential tests hold kafscale against.

One KRaft node that is both broker and controller (a static `controller.quorum.voters`), in a temporary directory
of its own, started from the jars that `tests/reference/pom.xml` copies into `tests/reference/lib/<version>/`
(`make test` installs them once; by hand: `mvn -q -B -f tests/reference/pom.xml -P kafka-<version>
dependency:copy-dependencies`). Two versions are installed: 4.4.0, the newest, and 3.9.2, the last with the
protocol versions Kafka 4.0 removed.

    with ReferenceKafka("4.4.0") as kafka:
        Producer({"bootstrap.servers": kafka.bootstrap})
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from kafscale.testing.etcd_server import _die_with_parent_prefix
from kafscale.testing.ports import free_port

LATEST = "4.4.0"
VERSIONS = ("4.4.0", "3.9.2")  # the profiles of tests/reference/pom.xml

REPO_ROOT = Path(__file__).resolve().parents[2]
LIB_ROOT = REPO_ROOT / "tests" / "reference" / "lib"

NODE_ID = 1

# A small heap, and a JVM that starts fast on 2 cores: the serial collector (no GC threads to start), only the
# C1 compiler (the test traffic is small; C2's warm-up would cost more CPU than it saves) and no perf-data file.
JVM_FLAGS = (
    "-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData",
    "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
)  # fmt: skip

# Kafka's own start script's settings (kafka-server-start.sh: a 1 GiB heap, G1, the full JIT), for a broker that is
# measured rather than tested (benchmarks/vs_kafka.py).
PRODUCTION_JVM_FLAGS = (
    "-Xms1g", "-Xmx1g", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent", "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
)  # fmt: skip

# What a single-node test broker needs beside its listeners. Every topic Kafka creates itself has one replica;
# its own topics get one partition (instead of 50) so the first group or transaction does not wait for 50
# partitions to be created. auto.create.topics.enable stays at Kafka's default, true, as in a stock broker.
BASE_PROPERTIES: dict[str, str] = {
    "num.partitions": "1",
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "group.initial.rebalance.delay.ms": "0",
    "auto.create.topics.enable": "true",
    "log.cleaner.backoff.ms": "500",  # compacted topics are cleaned promptly: tests wait for it
}
# Kafka 4 only: share groups' state topic (an unknown property would only be logged as such by 3.9). Consumer groups
# (KIP-848) keep Kafka's defaults (45 s sessions, 5 s heartbeats); only the lower bounds a group's own config may go
# down to are lowered, so a test can give its group a short session (IncrementalAlterConfigs on the GROUP resource,
# consumer.session.timeout.ms / consumer.heartbeat.interval.ms) without changing any other group.
BASE_PROPERTIES_4: dict[str, str] = {
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.consumer.min.session.timeout.ms": "6000",
    "group.consumer.min.heartbeat.interval.ms": "500",
}

_START_ATTEMPTS = 3  # a free port can be taken by another process before the broker binds it


class _PortTaken(Exception):
    pass


def lib_dir(version: str, lib_root: Path = LIB_ROOT) -> Path:
    """The folder of one version's jars; FileNotFoundError naming it, and how to fill it, when it is not there."""
    folder = lib_root / version
    if not (folder / f"kafka_2.13-{version}.jar").is_file():
        raise FileNotFoundError(
            f"Apache Kafka {version} is not installed: {folder} is missing or holds no kafka_2.13-{version}.jar. "
            f"Install it with `make reference-kafka` (which `make test` runs) or "
            f"`mvn -q -B -f {REPO_ROOT / 'tests/reference/pom.xml'} -P kafka-{version} dependency:copy-dependencies`"
        )
    return folder


def find_java() -> str:
    """$JAVA_HOME/bin/java, else `java` on PATH (Kafka 4 needs Java 17 or later)."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise FileNotFoundError("no java on PATH nor in $JAVA_HOME (scripts/install-system-deps.sh installs Java 17)")
    return found


def random_cluster_id() -> str:
    """A Kafka Uuid as StorageTool's `random-uuid` prints it: 16 bytes, URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class ReferenceKafka:
    """`with ReferenceKafka("4.4.0") as kafka: kafka.bootstrap` -- a real Apache Kafka, gone when it stops.

    overrides: more server.properties (they win over the defaults above), e.g. {"log.cleaner.backoff.ms": "500"}.
    The JVM dies with the thread that started it (PR_SET_PDEATHSIG, as etcd's): start it from a long-lived thread.
    """

    def __init__(self, version: str = LATEST, *, parent_dir: str | os.PathLike[str] | None = None,
                 overrides: Mapping[str, str] | None = None, lib_root: str | os.PathLike[str] = LIB_ROOT,
                 host: str = "127.0.0.1", jvm_flags: tuple[str, ...] = JVM_FLAGS) -> None:
        self.version = version
        self.lib = lib_dir(version, Path(lib_root))  # fails here, before any process, when the jars are missing
        self.java = find_java()
        self.host = host
        self.overrides = dict(overrides or {})
        self.jvm_flags = jvm_flags
        self.cluster_id = random_cluster_id()
        self.port = self.controller_port = 0
        self.start_seconds: float | None = None  # how long the last start() took, format included
        self._parent_dir = parent_dir
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    # ---------------------------------------------------------------------------------------------- addresses

    @property
    def bootstrap(self) -> str:
        if not self.port:
            raise RuntimeError("the reference broker is not started")
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def dir(self) -> Path:
        if self._dir is None:
            raise RuntimeError("the reference broker is not started")
        return self._dir

    @property
    def log_path(self) -> Path:
        """Kafka's own log (log4j), which names every error the broker met."""
        return self.dir / "server.log"

    @property
    def stdout_path(self) -> Path:
        return self.dir / "stdout.log"

    @property
    def major(self) -> int:
        return int(self.version.split(".", 1)[0])

    def rss_bytes(self) -> int:
        """The broker JVM's resident memory now (VmRSS)."""
        if self._proc is None:
            raise RuntimeError("the reference broker is not started")
        for line in Path(f"/proc/{self._proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS in /proc status")

    # --------------------------------------------------------------------------------------------- start, stop

    def start(self, timeout: float = 120.0) -> ReferenceKafka:
        if self._proc is not None and self._proc.poll() is None:
            return self
        began = time.monotonic()
        for attempt in range(_START_ATTEMPTS):
            self._dir = Path(tempfile.mkdtemp(prefix=f"kafka-{self.version}-", dir=self._parent_dir))
            self.port, self.controller_port = free_port(), free_port()
            while self.controller_port == self.port:
                self.controller_port = free_port()
            try:
                self._write_config()
                self._format(timeout)
                self._spawn()
                self._wait_ready(began + timeout)
                self.start_seconds = time.monotonic() - began
                return self
            except _PortTaken:
                self.stop()
                if attempt == _START_ATTEMPTS - 1:
                    raise RuntimeError(f"Kafka {self.version}: ports taken, {_START_ATTEMPTS} tries") from None
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (a controlled shutdown), then SIGKILL to its process group if it is still there after timeout;
        then the temporary directory goes."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                # Still running, so the group is still ours: its own session, the JVM and nothing else.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self.port = self.controller_port = 0

    def __enter__(self) -> ReferenceKafka:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # ----------------------------------------------------------------------------------------------- internals

    def properties(self) -> dict[str, str]:
        controller = f"{self.host}:{self.controller_port}"
        props = {
            "process.roles": "broker,controller",
            "node.id": str(NODE_ID),
            "controller.quorum.voters": f"{NODE_ID}@{controller}",  # static quorum: formatted without --standalone
            "controller.listener.names": "CONTROLLER",
            "listeners": f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{controller}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.dir / "data"),
            **BASE_PROPERTIES,
            **(BASE_PROPERTIES_4 if self.major >= 4 else {}),
        }
        props.update(self.overrides)
        return props

    def _write_config(self) -> None:
        lines = [f"{key}={value}" for key, value in self.properties().items()]
        (self.dir / "server.properties").write_text("\n".join(lines) + "\n")
        log = self.log_path
        if self.major >= 4:  # log4j2, through log4j-slf4j-impl
            (self.dir / "log4j2.properties").write_text(
                "status = warn\n"
                "appender.file.type = File\n"
                "appender.file.name = file\n"
                f"appender.file.fileName = {log}\n"
                "appender.file.layout.type = PatternLayout\n"
                "appender.file.layout.pattern = [%d] %p %m (%c)%n\n"
                "rootLogger.level = INFO\n"
                "rootLogger.appenderRef.file.ref = file\n"
            )
        else:  # reload4j (log4j 1.2 syntax), through slf4j-reload4j
            (self.dir / "log4j.properties").write_text(
                "log4j.rootLogger=INFO, file\n"
                "log4j.appender.file=org.apache.log4j.FileAppender\n"
                f"log4j.appender.file.File={log}\n"
                "log4j.appender.file.layout=org.apache.log4j.PatternLayout\n"
                "log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
            )

    def _java(self, main: str, *args: str) -> list[str]:
        if self.major >= 4:
            logging = f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}"
        else:
            logging = f"-Dlog4j.configuration=file:{self.dir / 'log4j.properties'}"
        return [self.java, *self.jvm_flags, f"-Djava.io.tmpdir={self.dir}", f"-Dkafka.logs.dir={self.dir}", logging,
                "-cp", f"{self.lib}/*", main, *args]

    def _format(self, timeout: float) -> None:
        config = str(self.dir / "server.properties")
        # --cluster-id=ID, not -t ID: a random id starts with '-' one time in 64, which argparse takes for an option
        command = self._java("kafka.tools.StorageTool", "format", f"--cluster-id={self.cluster_id}", "-c", config)
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
        if done.returncode != 0:
            output = (done.stdout + done.stderr).decode(errors="replace").strip()
            raise RuntimeError(f"Kafka {self.version} StorageTool format exited with {done.returncode}: {output}")

    def _spawn(self) -> None:
        with open(self.stdout_path, "ab") as out:
            self._proc = subprocess.Popen(
                [*_die_with_parent_prefix(), *self._java("kafka.Kafka", str(self.dir / "server.properties"))],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, which stop() kills as a whole
            )

    def _wait_ready(self, deadline: float) -> None:
        """Ready once the log says the server started and a Metadata request lists this broker."""
        from confluent_kafka.admin import AdminClient

        proc = self._proc
        assert proc is not None
        started = False
        while True:
            if proc.poll() is not None:
                text = self._log_tail()
                if "Address already in use" in text or "BindException" in text:
                    raise _PortTaken
                raise RuntimeError(f"Kafka {self.version} exited with {proc.returncode} while starting:\n{text}")
            if not started:
                started = self.log_path.exists() and b"Kafka Server started" in self.log_path.read_bytes()
            if started:
                admin = AdminClient({"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 2000})
                try:
                    if NODE_ID in admin.list_topics(timeout=2).brokers:
                        return
                except Exception:
                    pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"Kafka {self.version} did not start in time:\n{self._log_tail()}")
            time.sleep(0.1)

    def _log_tail(self, lines: int = 40) -> str:
        text = ""
        for path in (self.stdout_path, self.log_path):
            if path.exists():
                text += "".join(path.read_text(errors="replace").splitlines(keepends=True)[-lines:])
        return text
