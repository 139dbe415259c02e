"""Network helpers for runtime code (a leaf module: imports nothing from kafscale)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port free on the loopback interface right now (another process may still take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
