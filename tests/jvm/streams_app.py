"""The Kafka Streams word count (streams/src/io/kafscale/streams/WordCount.java) as a process the tests start,
watch and kill.

It is compiled with javac against Kafka Streams' jars, lib/streams-<version>/ (tests/jvm/pom.xml's streams
profile, which `make test` copies once), into build/streams-<version>/, once until its source changes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from kafscale.testing.kafka_reference import JVM_FLAGS, find_java
from tests.jvm.harness import BUILD, LIB, POM

STREAMS_VERSION = "4.4.0"
SRC = Path(__file__).resolve().parent / "streams" / "src"


def streams_lib(version: str = STREAMS_VERSION) -> Path:
    folder = LIB / f"streams-{version}"
    if not (folder / f"kafka-streams-{version}.jar").is_file():
        raise FileNotFoundError(
            f"Kafka Streams {version} is not installed: {folder} holds no kafka-streams-{version}.jar. Install it "
            f"with `make reference-kafka` (which `make test` runs) or "
            f"`mvn -q -B -f {POM} -P streams-{version} dependency:copy-dependencies`"
        )
    return folder


def compile_app(version: str = STREAMS_VERSION) -> Path:
    """build/streams-<version>/ with the app's classes, compiled now unless newer than its sources and jars
    (into a temporary folder renamed into place, so two sessions compiling at once never see half)."""
    out = BUILD / f"streams-{version}"
    sources = sorted(SRC.rglob("*.java"))
    stamp = out / ".compiled"
    newest = max(p.stat().st_mtime for p in [*sources, *streams_lib(version).iterdir()])
    if stamp.exists() and stamp.stat().st_mtime >= newest:
        return out
    BUILD.mkdir(exist_ok=True)
    javac = str(Path(find_java()).resolve().with_name("javac"))
    if not os.access(javac, os.X_OK):
        javac = shutil.which("javac") or "javac"
    tmp = Path(tempfile.mkdtemp(prefix=f".streams-{version}-", dir=BUILD))
    done = subprocess.run(
        [javac, "-J-XX:TieredStopAtLevel=1", "-J-XX:+UseSerialGC", "-nowarn", "-encoding", "UTF-8",
         "-d", str(tmp), "-cp", f"{streams_lib(version)}/*", *map(str, sources)],
        capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"javac against kafka-streams {version} failed:\n{done.stdout}{done.stderr}")
    (tmp / ".compiled").touch()
    old = BUILD / f".old-streams-{version}-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        out.rename(old)
    try:
        tmp.rename(out)
    except OSError:  # another session put its build there in between: the same sources, so use that one
        shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    return out


class WordCountApp:
    """One instance of the word count: `start()`, `wait_running()`, `kill()` (SIGKILL), `stop()` (SIGTERM, a
    clean close). Its standard output (state changes) and error (the client's warnings) go to log files in
    workdir; `log()` gives their tails."""

    def __init__(self, bootstrap: str, app_id: str, source: str, sink: str, workdir: Path,
                 store: str = "rocksdb", extra: dict[str, str] | None = None,
                 version: str = STREAMS_VERSION) -> None:
        self.classes = compile_app(version)
        self.classpath = f"{self.classes}:{streams_lib(version)}/*"
        self.args = [bootstrap, app_id, source, sink, str(workdir / "state"), store,
                     *(f"{k}={v}" for k, v in (extra or {}).items())]
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0
        self._lock = threading.Lock()

    @property
    def out_path(self) -> Path:
        return self.workdir / f"streams-{self.runs}.out"

    @property
    def err_path(self) -> Path:
        return self.workdir / f"streams-{self.runs}.err"

    def start(self) -> WordCountApp:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.runs += 1
        self.workdir.mkdir(parents=True, exist_ok=True)
        command = [find_java(), *JVM_FLAGS, f"-Djava.io.tmpdir={self.workdir}",
                   "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-Dorg.slf4j.simpleLogger.showDateTime=true",
                   "-cp", self.classpath, "io.kafscale.streams.WordCount", *self.args]
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                         start_new_session=True)
        return self

    def states(self) -> list[str]:
        if not self.out_path.exists():
            return []
        return [line.split(" ", 1)[1] for line in self.out_path.read_text(errors="replace").splitlines()
                if line.startswith("STATE ")]

    def wait_running(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while "RUNNING" not in self.states():
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"the Streams app exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the Streams app did not reach RUNNING in {timeout:.0f}s:\n{self.log()}")
            time.sleep(0.2)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """kill -9 of the JVM: no close, no commit, no LeaveGroup."""
        if self.alive():
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def stop(self, timeout: float = 30.0) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self, chars: int = 6000) -> str:
        text = ""
        for path in sorted(self.workdir.glob("streams-*.out")) + sorted(self.workdir.glob("streams-*.err")):
            text += f"--- {path.name}:\n{path.read_text(errors='replace')[-chars:]}\n"
        return text
