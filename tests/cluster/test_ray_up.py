"""`ray up deploy/ray-cluster.local.yaml` and `ray down`, run for real as a user runs them on one machine.

The file's own commands run: Ray's launcher logs in over SSH, copies the freshly built wheel (file mount), makes
~/kafscale-venv and pip-installs Ray and the wheel into it, starts a Ray head with token authentication, then
`kafscale serve --detach` against a real etcd and a real S3 server (SeaweedFS). Only what the file leaves to the
machine is replaced: the cluster's name, the SSH user and key, and every port and endpoint (free ones: other
tests' Ray clusters and servers run beside this one). A Kafka client then produces and consumes through both
shards' listeners, `kafscale cluster info` (through `ray exec`) shows the shards, and after `ray down` nothing
of the cluster may listen or run.

The node's user is a throw-away Unix account made by this test (hence root): `ray down` runs `ray stop` on the
node, which ends every Ray process its user may signal, so run as root it would end this session's Ray and every
other test's. SSH needs no daemon: each connection runs its own `sshd -i` as the ssh client's ProxyCommand
(Ray's `auth.ssh_proxy_command`). 1.5–2 minutes, most of it pip installing Ray into the new venv.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import ipaddress
import json
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kafscale.testing.etcd_server import EtcdServer
from kafscale.testing.ports import free_port
from kafscale.testing.ray_cluster import wait_until
from kafscale.testing.s3_servers import SeaweedS3Server, unique_bucket_name

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "deploy" / "ray-cluster.local.yaml"
RAY = Path(sys.executable).with_name("ray")
SSHD = Path("/usr/sbin/sshd")
TOPIC = "ray-up"
RECORDS = 20


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def loopback(address: str) -> bool:
    """Whether a listener's HOST:PORT (as `ss` prints it) is on loopback; `*` and `0.0.0.0` are not."""
    try:
        ip = ipaddress.ip_address(address.rpartition(":")[0].strip("[]"))
    except ValueError:
        return False
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback


def free_run(length: int) -> int:
    """A port p with p .. p+length-1 all free: a node's shards (and their /metrics) take consecutive ports."""
    for _ in range(200):
        first = free_port()
        if first + length > 65536:
            continue
        with contextlib.ExitStack() as held:
            try:
                for port in range(first + 1, first + length):
                    s = held.enter_context(socket.socket())
                    s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return first
    raise RuntimeError(f"no {length} consecutive free ports")


def free_ports() -> dict[str, int]:
    """This cluster's fixed ports, all distinct; the Kafka listener and /metrics take PORT and PORT+1 (two shards)."""
    while True:
        ports = {name: free_port() for name in ("gcs", "dashboard", "client_server", "dashboard_agent")}
        ports["kafka"], ports["metrics"] = free_run(2), free_run(2)
        taken = [*ports.values(), ports["kafka"] + 1, ports["metrics"] + 1]
        if len(set(taken)) == len(taken):
            return ports


def tail(proc: subprocess.CompletedProcess[str], lines: int = 40) -> str:
    return "\n".join((proc.stdout + proc.stderr).splitlines()[-lines:])


def run(*args: str | Path, check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120, **kwargs)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} exited with {proc.returncode}: {proc.stdout}{proc.stderr}")
    return proc


class NodeAccount:
    """The Unix user Ray's launcher logs in as: the one node of the `local` provider."""

    def __init__(self, name: str, keys: Path) -> None:
        self.name = name
        # Not under pytest's tmp_path: its base directory is root's alone (0700), and the user needs its home.
        self.home = Path("/tmp") / name
        self.keys = keys
        self.sshd_config = keys / "sshd_config"

    @property
    def proxy_command(self) -> str:
        return f"{SSHD} -i -f {self.sshd_config}"

    @property
    def client_key(self) -> Path:
        return self.keys / "client_key"

    def create(self) -> None:
        self.keys.mkdir(parents=True, exist_ok=True)
        for key in ("client_key", "host_key"):
            run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", self.name, "-f", self.keys / key)
        # '*': no password, yet not locked ('!'), which sshd would refuse even for a public key.
        run("useradd", "--create-home", "--home-dir", self.home, "--shell", "/bin/bash", "--user-group",
            "--password", "*", self.name)
        ssh_dir = self.home / ".ssh"
        ssh_dir.mkdir(mode=0o700)
        shutil.copy(self.client_key.with_suffix(".pub"), ssh_dir / "authorized_keys")
        tmp = self.home / "tmp"
        tmp.mkdir()
        for path in (ssh_dir, ssh_dir / "authorized_keys", tmp):
            shutil.chown(path, self.name, self.name)
        # The user's temporary files go under its home, which userdel removes: Ray's sessions, its address file
        # and the autoscaler's state (in /tmp/ray, which this session's Ray owns, `ray start` could not write
        # its address file, and `ray stop` would delete root's), and what its killed processes leave behind.
        self.sshd_config.write_text(
            f"HostKey {self.keys / 'host_key'}\n"
            "AuthorizedKeysFile .ssh/authorized_keys\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "UsePAM no\n"
            "StrictModes no\n"
            f"AllowUsers {self.name}\n"
            f"SetEnv TMPDIR={tmp} RAY_TMPDIR={tmp} RAY_USAGE_STATS_ENABLED=0\n"
            "LogLevel ERROR\n"
        )
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory

    def listeners(self) -> list[str]:
        """HOST:PORT of every TCP socket the user's processes listen on (`ss` prints the owner's uid)."""
        uid = pwd.getpwnam(self.name).pw_uid
        return [line.split()[3] for line in run("ss", "-Htlne").stdout.splitlines() if f" uid:{uid} " in line]

    def processes(self) -> list[int]:
        found = run("pgrep", "-u", self.name, check=False).stdout
        return [int(pid) for pid in found.split()]

    def remove(self) -> None:
        """Whatever `ray down` left of the user's processes is killed, then the user and its home go."""
        if self.processes():
            run("pkill", "-KILL", "-u", self.name, check=False)
            wait_until(lambda: not self.processes(), 10)
        run("userdel", "--remove", self.name, check=False)  # complains about a missing mail spool
        shutil.rmtree(self.home, ignore_errors=True)


class Launcher:
    """`ray up` / `ray exec` / `ray down` as root runs them from this checkout, on a config derived from the file."""

    def __init__(self, workdir: Path, config: dict[str, Any]) -> None:
        self.workdir = workdir  # `ray up` runs here: the file mounts ./dist
        self.config_path = workdir / "cluster.yaml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.cluster_name = str(config["cluster_name"])
        state = workdir / "launcher"
        state.mkdir()
        # The launcher keeps the local provider's state file and its config cache under RAY_TMPDIR and TMPDIR:
        # this run's own directory, not /tmp/ray. No RAY_* of this test session leaks into it.
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        self.env.update(RAY_TMPDIR=str(state), TMPDIR=str(state), RAY_USAGE_STATS_ENABLED="0")
        self.log = workdir / "ray-launcher.log"

    def __call__(self, *args: str, timeout: float = 480) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(RAY), *args], cwd=self.workdir, env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        with self.log.open("a") as log:
            log.write(f"$ ray {' '.join(args)}  -> {proc.returncode}\n{proc.stdout}{proc.stderr}\n")
        return proc

    def up(self) -> subprocess.CompletedProcess[str]:
        return self("up", "-y", str(self.config_path))

    def exec(self, command: str) -> subprocess.CompletedProcess[str]:
        return self("exec", str(self.config_path), command, timeout=180)

    def down(self) -> subprocess.CompletedProcess[str]:
        return self("down", "-y", str(self.config_path), timeout=180)

    def close_ssh(self) -> None:
        """End the SSH connections Ray keeps open for reuse (ControlPersist, 10 s) and remove their sockets."""
        control = Path("/tmp") / (f"ray_ssh_{hashlib.sha256(getpass.getuser().encode()).hexdigest()[:10]}/"
                                  f"{hashlib.sha256(self.cluster_name.encode()).hexdigest()[:10]}")
        if not control.is_dir():
            return
        for sock in control.iterdir():
            subprocess.run(["ssh", "-O", "exit", "-S", str(sock), "node"], capture_output=True, timeout=30)
        shutil.rmtree(control, ignore_errors=True)
        with contextlib.suppress(OSError):  # shared by every cluster this user launches: only if now empty
            control.parent.rmdir()



def derive_config(cluster_name: str, node: NodeAccount, ports: dict[str, int], etcd: EtcdServer,
                  s3: SeaweedS3Server, bucket: str) -> dict[str, Any]:
    """The file with this run's values in place; its commands otherwise as they are."""
    cfg: dict[str, Any] = yaml.safe_load(LOCAL.read_text())
    cfg["cluster_name"] = cluster_name
    cfg["auth"] = {"ssh_user": node.name, "ssh_private_key": str(node.client_key),
                   "ssh_proxy_command": node.proxy_command}
    values = {
        "--port": ports["gcs"],
        "--dashboard-port": ports["dashboard"],
        "--ray-client-server-port": ports["client_server"],
        "--dashboard-agent-listen-port": ports["dashboard_agent"],
        "--ray-address": f"127.0.0.1:{ports['gcs']}",
        "--listen": f"127.0.0.1:{ports['kafka']}",
        "--metrics-listen": f"127.0.0.1:{ports['metrics']}",
        "--s3-endpoint": s3.endpoint_url,
        "--s3-bucket": bucket,
        "--etcd-endpoints": f"http://{etcd.endpoint}",
    }
    commands: list[str] = cfg["head_start_ray_commands"]
    for flag, value in values.items():
        # The flag as a whole word (`--port` is not `--dashboard-port`), with its value after `=` or a space.
        pattern = re.compile(rf"(?<=\s){re.escape(flag)}([= ])\S+")
        found = sum(len(pattern.findall(c)) for c in commands)
        assert found == 1, f"{LOCAL.name}: expected {flag} once in head_start_ray_commands, found it {found} times"
        commands[:] = [pattern.sub(lambda m, f=flag, v=value: f"{f}{m.group(1)}{v}", c) for c in commands]
    return cfg


def build_wheel(dist: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(ROOT)],
                                stdout=out, stderr=subprocess.STDOUT)


def produce_and_consume(bootstrap: str) -> tuple[list[str], list[str]]:
    """RECORDS records over both partitions (acks=all), then read back by a consumer group."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, 2, 1)])[TOPIC].result(60)
    sent = [f"record-{i}" for i in range(RECORDS)]
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i, value in enumerate(sent):
        producer.produce(TOPIC, value=value.encode(), partition=i % 2)
    assert producer.flush(60) == 0, "records still unacknowledged after 60 s"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ray-up", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    got: list[str] = []
    try:
        consumer.subscribe([TOPIC])
        deadline = time.monotonic() + 60
        while len(got) < RECORDS and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                got.append(msg.value().decode())
    finally:
        consumer.close()
    return sent, got


@pytest.mark.timeout(600)  # pip installs Ray from the network: leave room for a slow index
def test_ray_up_serves_kafka_and_ray_down_leaves_nothing(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if os.geteuid() != 0:
        pytest.fail("tests/cluster/test_ray_up.py needs root: it makes (useradd) and removes (userdel) the Unix "
                    "user that Ray's launcher logs into, so that `ray down`'s `ray stop` cannot reach other Ray "
                    "processes", pytrace=False)
    missing = [tool for tool in ("ssh", "ssh-keygen", "rsync", "useradd", "ss") if shutil.which(tool) is None]
    missing += [] if SSHD.is_file() else [str(SSHD)]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: run scripts/install-system-deps.sh", pytrace=False)
    seaweed_server: SeaweedS3Server = request.getfixturevalue("seaweed_server")  # only now: after the checks

    started = time.monotonic()
    suffix = uuid.uuid4().hex[:8]
    node = NodeAccount(f"kfs-rayup-{suffix}", tmp_path / "ssh")
    wheel = build_wheel(tmp_path / "dist", tmp_path / "pip-wheel.log")  # meanwhile: the user, etcd
    ports = free_ports()
    fixed = {*ports.values(), ports["kafka"] + 1, ports["metrics"] + 1}
    bucket = unique_bucket_name("rayup")
    launcher: Launcher | None = None
    down: subprocess.CompletedProcess[str] | None = None
    with EtcdServer(tmp_path / "etcd") as etcd:
        try:
            node.create()
            assert wheel.wait(120) == 0, f"pip wheel failed: {(tmp_path / 'pip-wheel.log').read_text()}"
            launcher = Launcher(tmp_path, derive_config(f"kfs-rayup-{suffix}", node, ports, etcd, seaweed_server,
                                                        bucket))
            up = launcher.up()
            assert up.returncode == 0, f"ray up failed:\n{tail(up)}"
            up_done = time.monotonic()
            # Every port the file names is this cluster's (no default slipped past the substitution), and
            # nothing of it listens beyond loopback.
            assert wait_until(lambda: set(fixed) <= {int(a.rpartition(":")[2]) for a in node.listeners()}, 30), (
                f"expected listeners on {sorted(fixed)}, found {node.listeners()}")
            assert all(loopback(a) for a in node.listeners()), f"listening beyond 127.0.0.1: {node.listeners()}"

            bootstrap = f"127.0.0.1:{ports['kafka']}"
            brokers = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).brokers.values()
            assert sorted((b.host, b.port) for b in brokers) == [("127.0.0.1", ports["kafka"]),
                                                                 ("127.0.0.1", ports["kafka"] + 1)]
            sent, got = produce_and_consume(bootstrap)
            assert sorted(got) == sorted(sent), f"consumed {len(got)} of {len(sent)} records"

            # As on the node itself: the user's token (~/.ray/auth_token) and the user's venv.
            info = launcher.exec(f"RAY_AUTH_MODE=token ~/kafscale-venv/bin/kafscale cluster info "
                                 f"--ray-address 127.0.0.1:{ports['gcs']} -o json")
            assert info.returncode == 0, f"cluster info failed:\n{tail(info)}"
            # The JSON comes after Ray's own log lines.
            layout, _ = json.JSONDecoder().raw_decode(info.stdout[info.stdout.index("\n{") + 1 :])
            shards = [s for n in layout["nodes"] for s in n["shards"]]
            assert sorted((s["port"], s["live"]) for s in shards) == [(ports["kafka"], True),
                                                                      (ports["kafka"] + 1, True)]
            assert sorted(p for s in shards for p in s["partitions"]) == [f"{TOPIC}-0", f"{TOPIC}-1"]

            down_started = time.monotonic()
            down = launcher.down()
            assert down.returncode == 0, f"ray down failed:\n{tail(down)}"
            launcher.close_ssh()  # else Ray's SSH connection, and its sshd as the user, linger for 10 s
            assert wait_until(lambda: not any(listening(p) for p in fixed), 30), (
                f"still listening after ray down: {[p for p in fixed if listening(p)]}\n{tail(down)}")
            assert wait_until(lambda: not node.processes(), 30), (
                f"processes of {node.name} outlived ray down:\n"
                f"{run('ps', '-o', 'pid,args', '-u', node.name, check=False).stdout}\n{tail(down)}")
            print(f"ray up {up_done - started:.0f} s (wheel, user, install, start), kafka + cluster info "
                  f"{down_started - up_done:.0f} s, ray down {time.monotonic() - down_started:.0f} s")
        finally:
            if wheel.poll() is None:
                wheel.kill()
                wheel.wait()
            if launcher is not None:
                if down is None:
                    launcher.down()
                launcher.close_ssh()
            node.remove()
            seaweed_server.delete_bucket(bucket)
