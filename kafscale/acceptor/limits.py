"""Connection limits of a shard's listeners: Kafka's max.connections.per.ip, counted across all of them."""

from __future__ import annotations

from collections import Counter


class ConnectionLimits:
    def __init__(self, max_per_ip: int = 0) -> None:
        self.max_per_ip = max_per_ip  # 0: no limit
        self._open: Counter[str] = Counter()

    def admit(self, host: str) -> bool:
        """Count a new connection from host; False (and not counted) when host is at its limit."""
        if self.max_per_ip and self._open[host] >= self.max_per_ip:
            return False
        self._open[host] += 1
        return True

    def release(self, host: str) -> None:
        self._open[host] -= 1
        if self._open[host] <= 0:
            del self._open[host]
