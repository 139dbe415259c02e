"""A shard's lease against a real etcd while its event loop is congested, as a saturated data path makes it:
renewed from a thread of its own (kafscale.cluster.lease_renewal) the lease holds; renewed on the loop, the
same congestion lets it lapse, and the shard would stop serving as if it had died. A store that stalls longer than
the lease allows stops the shard whatever thread renews it; a longer lease (`lease_ttl_s`) rides it out."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from kafscale.cluster.lease_renewal import RenewalThread
from kafscale.cluster.membership import LEASE_TTL_S, BrokerRecord, Membership
from kafscale.cluster.placement import Placement
from kafscale.storage.etcd_store import EtcdStore
from kafscale.testing.etcd_server import EtcdServer

BLOCK_S = 0.4  # one long loop iteration (a saturated shard's were measured up to 0.6 s late)


async def congested_for(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(BLOCK_S)
        await asyncio.sleep(0)


async def lost_while(etcd: EtcdServer, disturbance: Callable[[], Awaitable[None]], *, threaded: bool = True,
                     lease_ttl_s: float = LEASE_TTL_S) -> int:
    """How often a registered shard stops serving during `disturbance`."""
    prefix = f"/lease-{uuid.uuid4().hex[:12]}/"
    meta = EtcdStore(etcd.endpoint, prefix=prefix)
    renewals = RenewalThread(lambda: EtcdStore(etcd.endpoint, prefix=prefix)) if threaded else None
    lost: list[float] = []

    async def on_lost() -> None:
        lost.append(time.monotonic())

    async def resync() -> None:
        return None

    membership = Membership(meta, Placement(0, [], lone=False), on_change=lambda: None, on_lost=on_lost,
                            resync=resync, renewals=renewals, lease_ttl_s=lease_ttl_s)
    try:
        await membership.start(BrokerRecord(0, "127.0.0.1", 9092))
        await disturbance()
        return len(lost)
    finally:
        await membership.stop()
        if renewals is not None:
            await asyncio.to_thread(renewals.close)
        await meta.delete("", prefix=True)
        await meta.close()


@pytest.mark.etcd
async def test_a_congested_loop_keeps_its_lease_when_renewals_have_their_own_thread(etcd_server: EtcdServer) -> None:
    assert await lost_while(etcd_server, lambda: congested_for(8), threaded=True) == 0


@pytest.mark.etcd
async def test_the_same_congestion_loses_the_lease_when_renewals_run_on_the_loop(etcd_server: EtcdServer) -> None:
    assert await lost_while(etcd_server, lambda: congested_for(8), threaded=False) > 0


async def paused(etcd: EtcdServer, seconds: float) -> None:
    """The store stalls (SIGSTOP), as an overloaded host's does, between a second of calm on either side."""
    await asyncio.sleep(1.0)
    assert etcd.pid is not None
    os.kill(etcd.pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(seconds)
    finally:
        os.kill(etcd.pid, signal.SIGCONT)
    await asyncio.sleep(1.0)


@pytest.mark.etcd
async def test_a_longer_lease_rides_out_a_store_stall_that_the_default_one_does_not(tmp_path: Path) -> None:
    with EtcdServer(tmp_path / "etcd") as etcd:  # its own: the test stops it
        assert await lost_while(etcd, lambda: paused(etcd, 3.0)) > 0
        assert await lost_while(etcd, lambda: paused(etcd, 3.0), lease_ttl_s=10.0) == 0
