"""The one back-off rule of the retry loops (storage/backoff.py)."""

from __future__ import annotations

import asyncio

import pytest

from kafscale.storage.backoff import Backoff, exponential


def test_exponential_doubles_up_to_the_cap() -> None:
    assert [exponential(a, 0.05, 2.0) for a in range(8)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert exponential(10_000, 0.05, 2.0) == 2.0  # no overflow after a long outage


async def test_backoff_waits_doubles_caps_and_resets(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    backoff = Backoff(0.05, 0.3)
    assert not backoff.at_cap
    for _ in range(4):
        await backoff.wait()
    assert slept == [0.05, 0.1, 0.2, 0.3]
    assert backoff.at_cap and backoff.delay == 0.3
    backoff.reset()
    assert backoff.delay == 0.05 and not backoff.at_cap
