"""A test host with its own IP address: a network namespace joined to this one by a veth pair.

The root side of the pair gets HOST_IP and the namespace side NODE_IP, on a /24 of their own, so servers
bound to HOST_IP serve the namespace and a Ray node started inside it is a separate machine as far as
addresses go. `cut()` takes the link down at both ends, so no packet passes either way while every socket
stays open, as in a network partition (this kernel has no netem to drop packets silently); `heal()`
restores the link. Everything is removed on exit. Needs root and iproute2.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=30)


def available() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip",):
        if subprocess.run(["which", tool], capture_output=True).returncode != 0:
            return f"{tool} (iproute2) is not installed"
    return None


class TestHost:
    __test__ = False  # not a pytest test class

    def __init__(self, subnet: int | None = None) -> None:
        tag = uuid.uuid4().hex[:6]
        self.name = f"ks-{tag}"
        self.outer, self.inner = f"ksh{tag}", f"ksn{tag}"
        net = subnet if subnet is not None else 100 + int(tag, 16) % 150
        self.host_ip, self.node_ip = f"10.213.{net}.1", f"10.213.{net}.2"
        self.created = False

    def start(self) -> TestHost:
        _run("ip", "netns", "add", self.name)
        self.created = True
        _run("ip", "link", "add", self.outer, "type", "veth", "peer", "name", self.inner)
        _run("ip", "link", "set", self.inner, "netns", self.name)
        _run("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.outer)
        _run("ip", "link", "set", self.outer, "up")
        self.exec("ip", "addr", "add", f"{self.node_ip}/24", "dev", self.inner)
        self.exec("ip", "link", "set", self.inner, "up")
        self.exec("ip", "link", "set", "lo", "up")
        return self

    def exec(self, *args: str) -> None:
        _run("ip", "netns", "exec", self.name, *args)

    def command(self, *args: str) -> list[str]:
        """args, to run inside the namespace (for subprocess.Popen)."""
        return ["ip", "netns", "exec", self.name, *args]

    def cut(self) -> None:
        """Both ends of the link go down: no packet passes either way; sockets stay open."""
        self.exec("ip", "link", "set", self.inner, "down")
        _run("ip", "link", "set", self.outer, "down")

    def heal(self) -> None:
        _run("ip", "link", "set", self.outer, "up")
        self.exec("ip", "link", "set", self.inner, "up")

    def stop(self) -> None:
        if not self.created:
            return
        with contextlib.suppress(subprocess.CalledProcessError):
            _run("ip", "link", "del", self.outer)  # takes its peer in the namespace with it
        with contextlib.suppress(subprocess.CalledProcessError):
            _run("ip", "netns", "del", self.name)
        self.created = False

    def __enter__(self) -> TestHost:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
