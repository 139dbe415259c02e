"""Exponential back-off for retry loops: one rule for every loop that waits after a store or actor failure.

``Backoff`` is the asyncio loop's state: the delay starts at ``first``, doubles after every failure up to
``cap``, and goes back to ``first`` after a success. ``exponential`` is the same rule as a function of the
attempt number, for loops that count attempts (S3's, which also adds full jitter).
"""

from __future__ import annotations

import asyncio

__all__ = ["Backoff", "exponential"]


def exponential(attempt: int, first: float, cap: float) -> float:
    """The delay before retry number ``attempt + 1``: ``first * 2**attempt``, at most ``cap``."""
    return min(cap, first * 2 ** min(attempt, 64))


class Backoff:
    """``await backoff.wait()`` after a failure, ``backoff.reset()`` after a success."""

    __slots__ = ("cap", "delay", "first")

    def __init__(self, first: float = 0.05, cap: float = 2.0) -> None:
        self.first = first
        self.cap = cap
        self.delay = first  # what the next wait() sleeps

    @property
    def at_cap(self) -> bool:
        """True once the delay has grown to the cap: a loop that may give up does so from here on."""
        return self.delay >= self.cap

    async def wait(self) -> None:
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, self.cap)

    def reset(self) -> None:
        self.delay = self.first
