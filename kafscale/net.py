"""Network helpers for runtime code (a leaf module: imports nothing from kafscale)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port free on the loopback interface right now (another process may still take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def address_towards(address: str) -> str | None:
    """This machine's IP on the route to HOST:PORT (no packet is sent), or None for `auto` or a bad address.

    A Ray driver must name the node it runs on; the address it reaches the head from is that node's.
    """
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(host), int(port)))
            return str(s.getsockname()[0])
    except OSError:
        return None
