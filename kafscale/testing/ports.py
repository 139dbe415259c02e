"""Free TCP ports on the loopback interface (the helper lives in kafscale.net, for runtime code too)."""

from __future__ import annotations

from kafscale.net import free_port

__all__ = ["free_port"]
