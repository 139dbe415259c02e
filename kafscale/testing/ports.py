"""Free TCP ports for test servers, outside the ranges other processes are handed ports from.

A port the kernel hands out for `bind(0)` comes from its ephemeral range (32768-60999 here), the same range Ray's
processes, gRPC and every client socket draw from: once released, it can go to one of them before the test's
server binds it (a test cluster's shard once found its port taken by another process on its node's address).
Ray's worker ports are 10002-19999. Test ports come from between the two, and must be free on every address.
"""

from __future__ import annotations

import random
import socket

LOW, HIGH = 20_000, 32_000


def free_port() -> int:
    """A TCP port free on every local address right now, from a range the kernel and Ray do not hand out."""
    for _ in range(200):
        port = random.randrange(LOW, HIGH)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port in {LOW}-{HIGH}")


def free_ports_in_a_row(count: int) -> int:
    """The first of `count` consecutive free ports (a listener's shards bind PORT, PORT+1, ...)."""
    for _ in range(200):
        first = random.randrange(LOW, HIGH - count)
        taken = []
        try:
            for port in range(first, first + count):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                taken.append(s)
                s.bind(("0.0.0.0", port))
        except OSError:
            continue
        finally:
            for s in taken:
                s.close()
        return first
    raise RuntimeError(f"no {count} free TCP ports in a row in {LOW}-{HIGH}")
