"""PartitionOwner fencing on real stores: the tests of tests/unit/test_partition_owner.py that run on the embedded
stores and on a real etcd plus a real S3 API (moto), split from it whole (helpers are imported from there)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from kafscale.broker.partition_owner import PartitionError
from kafscale.storage import keys as object_keys
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.etcd_store import EtcdStore
from kafscale.storage.local_store import LocalDirStore
from kafscale.storage.metadata_store import MetadataStore
from kafscale.testing.etcd_server import EtcdServer
from kafscale.testing.s3_servers import MotoS3Server
from tests.unit.test_partition_owner import (
    NS,
    TOPIC,
    Env,
    batch,
    durable,
    read_all,
    segment_object_key,
    stored_records,
    values,
)


@pytest.fixture(params=["embedded+local", "etcd+moto"])
def real_servers(request: pytest.FixtureRequest) -> tuple[EtcdServer, MotoS3Server] | None:
    """Session servers are fetched here, outside any event loop, and only for the backend in use."""
    if request.param == "etcd+moto":
        return request.getfixturevalue("etcd_server"), request.getfixturevalue("moto_server")
    return None


@pytest.fixture
async def real_env(real_servers: tuple[EtcdServer, MotoS3Server] | None, tmp_path: Path) -> AsyncIterator[Env]:
    """The same tests on the embedded stores and on a real etcd plus a real S3 API (moto)."""
    if real_servers is None:
        meta: MetadataStore = EmbeddedStore(tmp_path / "meta.sqlite", fsync=False)
        e = Env(meta, LocalDirStore(tmp_path / "objects"))
    else:
        etcd, moto = real_servers
        meta = EtcdStore(etcd.endpoint, prefix=f"/test-{uuid.uuid4().hex[:12]}/")
        bucket = moto.store()
        e = Env(meta, bucket)
    try:
        yield e
    finally:
        await e.aclose()
        if real_servers is not None:
            await meta.delete("", prefix=True)
            real_servers[1].delete_bucket(bucket.bucket)
        await meta.close()


# ---------------------------------------------------------------- fencing


async def test_zombie_cannot_commit_over_or_overwrite_its_successor(real_env: Env) -> None:
    a = await real_env.owner()
    await durable(await a.append(batch(values(2, "a")), acks=-1))
    b = await real_env.owner()  # takes the partition over: epoch bump
    assert b.epoch == a.epoch + 1 and b.high_watermark == 2
    b_first = await b.append(batch(values(1, "b")), acks=-1)
    await durable(b_first)
    assert b_first.base_offset == 2
    b_object = real_env.store.get(segment_object_key(2))

    zombie = await a.append(batch(values(3, "zombie")), acks=-1)  # A still believes next offset is 2
    assert zombie.base_offset == 2 and zombie.durable is not None
    with pytest.raises(PartitionError) as refused:
        await asyncio.wait_for(asyncio.shield(zombie.durable), 10)
    assert refused.value.code == ErrorCode.not_leader_or_follower
    assert a.fenced and a.high_watermark == 2
    assert real_env.store.get(segment_object_key(2)) == b_object  # conditional create kept B's object
    # The zombie's upload went to the keys of its own epoch, which nobody reads: nothing was deleted.
    assert real_env.store.get(object_keys.segment_key(NS, TOPIC, 0, 2, a.epoch))
    assert (await a.append(batch(values(1, "late")), acks=-1)).error == ErrorCode.not_leader_or_follower

    await durable(await b.append(batch(values(1, "b2")), acks=-1))
    expected = list(enumerate(values(2, "a") + values(1, "b") + values(1, "b2")))
    assert await read_all(b) == expected
    assert await read_all(await real_env.owner()) == expected
    assert (await stored_records(real_env)) == expected


async def test_zombie_flushing_first_is_refused_and_its_upload_replaced(real_env: Env) -> None:
    a = await real_env.owner()
    b = await real_env.owner()
    zombie = await a.append(batch(values(2, "zombie")), acks=-1)
    assert zombie.durable is not None
    with pytest.raises(PartitionError) as refused:
        await asyncio.wait_for(asyncio.shield(zombie.durable), 10)
    assert refused.value.code == ErrorCode.not_leader_or_follower
    assert a.fenced and a.high_watermark == 0
    assert b.high_watermark == 0

    ours = await b.append(batch(values(1, "b")), acks=-1)  # at offset 0, where A's upload lies
    await durable(ours)
    assert ours.base_offset == 0
    assert (await stored_records(real_env)) == [(0, b"b0")]
    assert await read_all(await real_env.owner()) == [(0, b"b0")]
