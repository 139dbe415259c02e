"""Failed authentications from one address are answered ever more slowly (and the connection then closes).

Kafka delays every failed authentication by connection.failed.authentication.delay.ms (100 ms). Here the delay
starts there and doubles with every FAILURES_PER_DOUBLING recent failures from the same address, up to
MAX_DELAY_S: a password guesser on one address gets a few guesses a second per connection, while a client that
mistyped once waits 100 ms. An address's count is forgotten after FORGET_S without a failure. The delay holds
only that connection's answer; the event loop, and every other client, go on.
"""

from __future__ import annotations

import time
from collections.abc import Callable

BASE_DELAY_S = 0.1
MAX_DELAY_S = 2.0
FAILURES_PER_DOUBLING = 10
FORGET_S = 60.0
MAX_ADDRESSES = 100_000  # beyond this many addresses, the oldest are forgotten (memory stays bounded)


class FailureThrottle:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._failures: dict[str, tuple[int, float]] = {}  # address -> (count, last failure)
        self.total = 0

    def failed(self, address: str) -> float:
        """Count a failure; returns how long to wait before answering it."""
        now = self._clock()
        count, last = self._failures.pop(address, (0, now))
        count = 1 if now - last > FORGET_S else count + 1
        self._failures[address] = (count, now)  # re-inserted: the dict stays in order of last failure
        if len(self._failures) > MAX_ADDRESSES:
            del self._failures[next(iter(self._failures))]
        self.total += 1
        return min(BASE_DELAY_S * 2 ** ((count - 1) // FAILURES_PER_DOUBLING), MAX_DELAY_S)
