"""The metadata actor's direct channel: calls from its node go over it, strangers and bad bytes are shut
out without harming the actor, and a lost actor fails calls with MetadataStoreError instead of hanging.

The store's contract over the channel is the conformance suite's "remote" backend (test_metadata_store).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from kafscale.actors.metadata_actor import MetadataStoreActor, RemoteMetadataStore
from kafscale.storage.metadata_store import Compare, MetadataStoreError, Put


@pytest.fixture
async def actor(ray_runtime: Any, tmp_path: Path) -> AsyncIterator[Any]:
    handle = MetadataStoreActor.remote(data_dir=str(tmp_path))
    await handle.ready.remote()
    try:
        yield handle
    finally:
        with contextlib.suppress(Exception):  # a test killed it
            await handle.close.remote()
        ray_runtime.kill(handle)


async def channel_calls(actor: Any) -> int:
    return await actor.__ray_call__.remote(
        lambda self: 0 if self._channel is None or not self._channel.done() else self._channel.result().calls)


async def test_calls_from_the_actors_node_go_over_the_channel(actor: Any) -> None:
    store = RemoteMetadataStore(actor)
    rev = await store.put("a", {"n": 1})
    result = await store.txn([Compare("a", "mod_revision", "==", rev)], [Put("a", {"n": 2})])
    assert result.succeeded
    kv = await store.get("a")
    assert kv is not None and kv.value == {"n": 2}
    assert await channel_calls(actor) == 3

    ray_only = RemoteMetadataStore(actor, direct=False)
    kv = await ray_only.get("a")
    assert kv is not None and kv.value == {"n": 2}
    assert await channel_calls(actor) == 3  # that one went through Ray
    await store.close()
    await ray_only.close()


def _exchange(address: str, *messages: bytes) -> bytes:
    """Send raw bytes on a fresh connection; what comes back before the actor closes it (b"" if nothing).

    The actor closes as soon as it has read a bad message. If the next message arrived after that read but
    before the close, Linux resets the connection (unread data at a Unix socket's close), and if it comes after
    the close, our send fails: either way the actor shut us out, which is the outcome looked for. A reset
    loses nothing sent to us before it (recv returns queued data first), and a connection the actor left
    open still fails here, by the timeout."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(address)
        received = b""
        try:
            for m in messages:
                sock.sendall(m)
            while chunk := sock.recv(65536):
                received += chunk
        except (ConnectionResetError, BrokenPipeError):
            pass
        return received


async def test_strangers_and_bad_bytes_are_shut_out_and_the_actor_goes_on(actor: Any) -> None:
    _node, address, token = await actor.channel.remote()
    request = msgpack.packb([1, "revision", []])
    refused = [
        [msgpack.packb(b"not the token"), request],  # wrong token: closed before any answer
        [request],  # no token at all
        [msgpack.packb(token), b"\xc1"],  # a byte msgpack never uses
        [msgpack.packb(token), msgpack.packb("not a request")],
        [msgpack.packb(token), msgpack.packb([1, "revision"])],
    ]
    for messages in refused:
        assert await asyncio.to_thread(_exchange, address, *messages) == b"", messages

    # An unknown call or bad arguments get an error answer on a connection that stays usable.
    def answers() -> list[Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(address)
            sock.sendall(msgpack.packb(token) + msgpack.packb([1, "drop_everything", []])
                         + msgpack.packb([2, "txn", [[["k", "nonsense", "==", 0]], [], []]])
                         + msgpack.packb([3, "revision", []]))
            unpacker = msgpack.Unpacker(raw=False)
            got: list[Any] = []
            while len(got) < 3:
                unpacker.feed(sock.recv(65536))
                got.extend(unpacker)
            return sorted(got)

    (id1, ok1, err1), (id2, ok2, err2), (id3, ok3, revision) = await asyncio.to_thread(answers)
    assert (id1, ok1, err1[0]) == (1, False, "value") and "drop_everything" in err1[1]
    assert (id2, ok2, err2[0]) == (2, False, "value") and "nonsense" in err2[1]
    assert (id3, ok3, revision) == (3, True, 0)

    store = RemoteMetadataStore(actor)
    assert await store.put("still", "here") == 1
    await store.close()


async def test_errors_come_back_as_the_stores_own(actor: Any) -> None:
    store = RemoteMetadataStore(actor)
    with pytest.raises(ValueError, match="unknown compare op"):
        await store.txn([Compare("k", "version", "~", 0)], [Put("k", 1)])  # type: ignore[arg-type]
    with pytest.raises(MetadataStoreError, match="requested lease not found"):
        await store.put("k", 1, lease=12345)
    await store.close()


async def test_a_lost_actor_fails_calls_instead_of_hanging(ray_runtime: Any, actor: Any) -> None:
    store = RemoteMetadataStore(actor)
    await store.put("k", 1)
    assert await channel_calls(actor) == 1
    pid = await actor.__ray_call__.remote(lambda self: os.getpid())
    ray_runtime.kill(actor)
    async with asyncio.timeout(60):
        while _alive(pid):  # kill() only asks Ray; the process ends a moment later
            await asyncio.sleep(0.05)
        with pytest.raises(MetadataStoreError):
            await store.get("k")
        with pytest.raises(MetadataStoreError):  # and again: reopening asks Ray, which knows it is gone
            await store.put("k", 2)
    await store.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_closing_the_actor_closes_the_channel(actor: Any) -> None:
    store = RemoteMetadataStore(actor)
    await store.put("k", 1)
    await actor.close.remote()
    async with asyncio.timeout(60):
        with pytest.raises(MetadataStoreError, match=r"closed|unreachable"):
            await store.get("k")
        with pytest.raises(MetadataStoreError, match="store is closed"):
            await store.get("k")
    await store.close()
