"""Running the JVM against kafscale: the Java client through the test driver, and Kafka's own tools.

The driver (src/io/kafscale/jvm/*.java, ours) is compiled with javac against each client version's jars,
lib/clients-<version>/ (tests/jvm/pom.xml, which `make test` copies once), into build/clients-<version>/, once
until a source changes. It reads a scenario (JSON) on standard input and prints a `RESULT {...}` line per step;
`Driver.run` starts one JVM for a whole scenario and answers the results in order; `Driver.start` starts one that
runs while the test goes on (a group member, a producer), printing EVENT lines as things happen (`Live`).

Kafka's tools run from the reference broker's jars, tests/reference/lib/4.4.0/ (`Tools.run`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafscale.testing.etcd_server import _die_with_parent_prefix
from kafscale.testing.kafka_reference import JVM_FLAGS, LIB_ROOT, find_java, lib_dir

HERE = Path(__file__).resolve().parent
SRC = HERE / "src"
LIB = HERE / "lib"
BUILD = HERE / "build"
POM = HERE / "pom.xml"

# The profiles of tests/jvm/pom.xml: the newest 4.x, the last 3.x, the first idempotent by default, the last 2.x.
CLIENT_VERSIONS = ("4.4.0", "3.9.2", "3.0.2", "2.8.2")
TOOLS_VERSION = "4.4.0"

# slf4j-simple: the clients' warnings (not their INFO chatter) on standard error.
_CLIENT_LOGGING = ("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-Dorg.slf4j.simpleLogger.logFile=System.err")


def client_lib(version: str) -> Path:
    folder = LIB / f"clients-{version}"
    if not (folder / f"kafka-clients-{version}.jar").is_file():
        raise FileNotFoundError(
            f"the Java client {version} is not installed: {folder} holds no kafka-clients-{version}.jar. Install it "
            f"with `make reference-kafka` (which `make test` runs) or "
            f"`mvn -q -B -f {POM} -P clients-{version} dependency:copy-dependencies`"
        )
    return folder


def compile_driver(version: str) -> Path:
    """build/clients-<version>/ with the driver's classes, compiled now unless they are newer than every source.

    Compiled into a temporary folder that is then renamed, so two sessions compiling at once never see half."""
    out = BUILD / f"clients-{version}"
    sources = sorted(SRC.rglob("*.java"))
    stamp = out / ".compiled"
    newest = max(p.stat().st_mtime for p in [*sources, *client_lib(version).iterdir()])
    if stamp.exists() and stamp.stat().st_mtime >= newest:
        return out
    BUILD.mkdir(exist_ok=True)
    javac = str(Path(find_java()).resolve().with_name("javac"))
    if not os.access(javac, os.X_OK):
        javac = shutil.which("javac") or "javac"
    tmp = Path(tempfile.mkdtemp(prefix=f".clients-{version}-", dir=BUILD))
    done = subprocess.run(
        [javac, "-J-XX:TieredStopAtLevel=1", "-J-XX:+UseSerialGC", "-nowarn", "-encoding", "UTF-8",
         "-d", str(tmp), "-cp", f"{client_lib(version)}/*", *map(str, sources)],
        capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"javac against kafka-clients {version} failed:\n{done.stdout}{done.stderr}")
    (tmp / ".compiled").touch()
    old = BUILD / f".old-{version}-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        out.rename(old)
    try:
        tmp.rename(out)
    except OSError:  # another session put its build there in between: the same sources, so use that one
        shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    return out


@dataclass
class Run:
    """What one driver JVM answered: a result per step (each {"op", "ms", ...}, "error" when it failed)."""

    version: str
    results: list[dict[str, Any]]
    stderr: str
    seconds: float
    by_name: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __getitem__(self, name: str) -> dict[str, Any]:
        """The result of the step given "name" in the scenario."""
        return self.by_name[name]

    def ok(self, name: str) -> dict[str, Any]:
        """The named step's result, which must not be an error."""
        result = self.by_name[name]
        assert "error" not in result, f"{self.version} {name}: {result}\n--- client log:\n{self.stderr[-4000:]}"
        return result


class Driver:
    def __init__(self, version: str) -> None:
        self.version = version
        self.java = find_java()
        self.classes = compile_driver(version)
        self.classpath = f"{self.classes}:{client_lib(version)}/*"

    def run(self, config: Mapping[str, Any], steps: Sequence[Mapping[str, Any]], timeout: float = 600) -> Run:
        """One JVM for the whole scenario; steps may carry a "name" for Run[...] (else "<index>")."""
        scenario = json.dumps({"config": dict(config), "steps": list(steps)})
        began = time.monotonic()
        command = [self.java, *JVM_FLAGS, *_CLIENT_LOGGING, "-cp", self.classpath, "io.kafscale.jvm.Driver"]
        done = subprocess.run(command, input=scenario, capture_output=True, text=True, timeout=timeout)
        seconds = time.monotonic() - began
        results = [json.loads(line[len("RESULT "):]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode != 0 or len(results) != len(steps):
            raise AssertionError(f"the driver ({self.version}) exited with {done.returncode} after {len(results)} of "
                                 f"{len(steps)} steps:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
        run = Run(self.version, results, done.stderr, seconds)
        for i, (step, result) in enumerate(zip(steps, results, strict=True)):
            run.by_name[str(step.get("name", i))] = result
        return run

    def start(self, config: Mapping[str, Any], steps: Sequence[Mapping[str, Any]], workdir: Path,
              name: str) -> Live:
        """A JVM running the scenario while the test goes on: its "member" and "produce_until" steps last until
        Live.stop(). Its output goes to workdir/<name>.out and .err; it dies with this thread (PR_SET_PDEATHSIG)."""
        stop_file = workdir / f"{name}.stop"
        stop_file.unlink(missing_ok=True)
        scenario = json.dumps({"config": dict(config),
                               "steps": [{**step, "stop_file": str(stop_file)} for step in steps]})
        command = [*_die_with_parent_prefix(), self.java, *JVM_FLAGS, *_CLIENT_LOGGING, "-cp", self.classpath,
                   "io.kafscale.jvm.Driver"]
        out, err = workdir / f"{name}.out", workdir / f"{name}.err"
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=stdout, stderr=stderr)
        assert proc.stdin is not None
        proc.stdin.write(scenario.encode())
        proc.stdin.close()
        return Live(name, proc, stop_file, out, err, len(steps))


class Live:
    """A driver JVM that Driver.start started: events() are the EVENT lines it printed so far, stop() ends its
    steps (they see the stop file) and answers their results, kill() is kill -9 (no close, no leave)."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes], stop_file: Path, out: Path, err: Path,
                 steps: int) -> None:
        self.name, self.proc, self.stop_file, self.out, self.err, self.steps = name, proc, stop_file, out, err, steps
        self.killed_at: float | None = None  # wall-clock ms, as the events' "t"
        self.paused_at: float | None = None

    def lines(self, prefix: str) -> list[dict[str, Any]]:
        found = []
        for line in self.out.read_text(errors="replace").splitlines(keepends=True):
            if line.startswith(prefix) and line.endswith("\n"):  # a line being written is not whole yet
                found.append(json.loads(line[len(prefix):]))
        return found

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.lines("EVENT ") if kind is None or e["event"] == kind]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 60) -> list[dict[str, Any]]:
        """Asks the steps to end, waits for the JVM, answers the steps' results (AssertionError if it failed)."""
        self.stop_file.touch()
        if self.paused_at is not None and self.alive():
            self.resume()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} did not stop within {timeout:.0f}s (killed)\n{self.log()}") from None
        results = self.lines("RESULT ")
        if self.proc.returncode != 0 or len(results) != self.steps:
            raise AssertionError(f"{self.name} exited with {self.proc.returncode} after {len(results)} of "
                                 f"{self.steps} steps\n{self.log()}")
        return results

    def pause(self) -> None:
        """SIGSTOP: the JVM stays, but neither polls nor heartbeats until resume()."""
        self.paused_at = time.time() * 1000
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.alive():
            self.killed_at = time.time() * 1000
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def log(self, chars: int = 6000) -> str:
        """The tails of its standard output (events, results) and error (the client's warnings)."""
        return (f"--- {self.out.name}:\n{self.out.read_text(errors='replace')[-chars:]}\n"
                f"--- {self.err.name}:\n{self.err.read_text(errors='replace')[-chars:]}")


# ------------------------------------------------------------------------------------------------- Kafka's tools


@dataclass
class ToolRun:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def check(self) -> ToolRun:
        assert self.returncode == 0, self.describe()
        return self

    def describe(self) -> str:
        return (f"{' '.join(self.args)} exited with {self.returncode} after {self.seconds:.1f}s\n--- stdout:\n"
                f"{self.stdout[-4000:]}\n--- stderr:\n{self.stderr[-4000:]}")


class Tools:
    """`java -cp 'tests/reference/lib/4.4.0/*' <main class> ...`, Kafka's command-line tools (what kafka-*.sh run),
    logging WARN and above to standard error."""

    def __init__(self, workdir: Path, version: str = TOOLS_VERSION, lib_root: Path = LIB_ROOT) -> None:
        self.lib = lib_dir(version, lib_root)
        self.java = find_java()
        self.workdir = workdir
        self.log_config = workdir / "tools-log4j2.properties"
        self.log_config.write_text(
            "status = error\n"
            "appender.err.type = Console\n"
            "appender.err.name = err\n"
            "appender.err.target = SYSTEM_ERR\n"
            "appender.err.layout.type = PatternLayout\n"
            "appender.err.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = WARN\n"
            "rootLogger.appenderRef.err.ref = err\n"
        )

    def run(self, main: str, *args: str, stdin: str = "", timeout: float = 180) -> ToolRun:
        command = [self.java, *JVM_FLAGS, f"-Dlog4j2.configurationFile={self.log_config}",
                   f"-Djava.io.tmpdir={self.workdir}", "-cp", f"{self.lib}/*", main, *args]
        began = time.monotonic()
        done = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=timeout,
                              cwd=self.workdir)
        return ToolRun([main.rsplit(".", 1)[-1], *args], done.returncode, done.stdout, done.stderr,
                       time.monotonic() - began)
