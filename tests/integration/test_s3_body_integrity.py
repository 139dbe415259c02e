"""S3Store sends each PUT body unsigned with its CRC32C in a header, so the server itself refuses a body
damaged on the way (BadDigest), and the store sends it again. The damage is made by a real TCP proxy in
front of a real SeaweedFS, which flips one byte of the first PUT body that passes through it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kafscale.storage.object_store import ObjectNotFoundError, ObjectStoreError
from kafscale.storage.s3_store import S3Store
from kafscale.testing.s3_servers import MotoS3Server, SeaweedS3Server, unique_bucket_name


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


class BodyFlippingProxy:
    """Forwards 127.0.0.1 connections to `target`; flips byte `at` of the first PUT body it sees."""

    def __init__(self, target: tuple[str, int], at: int = 1000) -> None:
        self.target, self.at = target, at
        self.flipped = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self._sockets += [client, server]
            threading.Thread(target=self._pipe, args=(client, server, self._damage_first_put()), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, lambda chunk: chunk), daemon=True).start()

    def _damage_first_put(self) -> Callable[[bytes], bytes]:
        """The edit of one client-to-server stream: a PUT is held back until byte `at` of its body has
        arrived, which is then flipped (once per proxy); everything else passes as it is."""
        held = b""  # bytes of a PUT whose body has not yet reached the byte to flip

        def edit(chunk: bytes) -> bytes:
            nonlocal held
            with self._lock:
                armed = self.flipped == 0
            data, held = held + chunk, b""
            if not armed or not data.startswith(b"PUT "):
                return data
            head = data.find(b"\r\n\r\n")
            pos = head + 4 + self.at
            if head >= 0 and _content_length(data[:head]) <= self.at:
                return data  # too short to damage here (the store's checksum probe)
            if head < 0 or len(data) <= pos:
                held = data
                return b""
            with self._lock:
                self.flipped += 1
            return data[:pos] + bytes([data[pos] ^ 0xFF]) + data[pos + 1 :]

        return edit

    def _pipe(self, src: socket.socket, dst: socket.socket, edit: Callable[[bytes], bytes]) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(edit(chunk))
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()


@pytest.fixture
def proxied_store(seaweed_server: SeaweedS3Server) -> Iterator[tuple[BodyFlippingProxy, str]]:
    bucket = unique_bucket_name("flip")
    seaweed_server.store(bucket).close()
    host, port = seaweed_server.endpoint_url.removeprefix("http://").rsplit(":", 1)
    proxy = BodyFlippingProxy((host, int(port)))
    try:
        yield proxy, bucket
    finally:
        proxy.close()
        seaweed_server.delete_bucket(bucket)


def _store(seaweed: SeaweedS3Server, proxy: BodyFlippingProxy, bucket: str, attempts: int) -> S3Store:
    return S3Store(bucket, endpoint_url=f"http://127.0.0.1:{proxy.port}", region=seaweed.region,
                   access_key=seaweed.access_key, secret_key=seaweed.secret_key, max_attempts=attempts)


@pytest.mark.parametrize("op", ["put", "put_if_absent"])
def test_a_body_damaged_on_the_way_is_refused_by_the_server_and_sent_again(
    seaweed_server: SeaweedS3Server, proxied_store: tuple[BodyFlippingProxy, str], op: str
) -> None:
    proxy, bucket = proxied_store
    store = _store(seaweed_server, proxy, bucket, attempts=3)
    data = bytes(range(256)) * 64
    getattr(store, op)("seg/1.kfs", data)
    assert proxy.flipped == 1
    assert store.get("seg/1.kfs") == data
    store.close()


def test_a_damaged_body_is_never_stored(
    seaweed_server: SeaweedS3Server, proxied_store: tuple[BodyFlippingProxy, str]
) -> None:
    proxy, bucket = proxied_store
    store = _store(seaweed_server, proxy, bucket, attempts=1)
    with pytest.raises(ObjectStoreError, match="BadDigest") as info:
        store.put_if_absent("seg/1.kfs", b"x" * 4096)
    assert not isinstance(info.value, ObjectNotFoundError)
    assert proxy.flipped == 1
    with pytest.raises(ObjectNotFoundError):
        store.get("seg/1.kfs")
    store.close()


def test_the_store_learns_whether_the_server_checks_the_crc32c_header(
    seaweed_server: SeaweedS3Server, moto_server: MotoS3Server
) -> None:
    """SeaweedFS refuses a wrong CRC32C header, so bodies go unsigned; moto ignores it, so bodies are signed
    with SHA-256 (still refused when damaged, by any server that checks signatures). The probe object
    leaves nothing behind."""
    for server, checks in ((seaweed_server, True), (moto_server, False)):
        store = server.store()
        data = bytes(range(256)) * 8
        assert store.put_if_absent("seg/1.kfs", data)
        assert store._checks_crc is checks
        assert (store._signed_client is None) is checks
        store.put("seg/2.kfs", data)
        assert [o.key for o in store.list("")] == ["seg/1.kfs", "seg/2.kfs"]
        assert store.get("seg/1.kfs") == data and store.get("seg/2.kfs") == data
        store.close()
        server.delete_bucket(store.bucket)


def test_warm_up_runs_the_crc32c_probe_before_the_first_put_and_never_raises(
    seaweed_server: SeaweedS3Server,
) -> None:
    """A shard warms its store up when it starts, so the probe (botocore's first PutObject in the
    process, ~200 ms of set-up) is not paid inside the first produce. An unreachable server makes it a
    no-op: the probe is asked again on the first PUT."""
    store = seaweed_server.store()
    store.warm_up()
    assert store._checks_crc is True
    store.close()
    seaweed_server.delete_bucket(store.bucket)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    down = S3Store(unique_bucket_name(), endpoint_url=f"http://127.0.0.1:{closed_port}", access_key="a",
                   secret_key="b", max_attempts=1, connect_timeout=0.5, read_timeout=0.5)
    down.warm_up()
    assert down._checks_crc is None
    down.close()


async def test_a_starting_shard_warms_its_object_store_up(seaweed_server: SeaweedS3Server, tmp_path: Path) -> None:
    from kafscale.broker.shard import ShardCore
    from kafscale.config import BrokerConfig
    from kafscale.storage.embedded_store import EmbeddedStore

    store = seaweed_server.store()
    core = ShardCore(0, BrokerConfig(listen="127.0.0.1:0"), meta=EmbeddedStore(tmp_path / "m.db"), objects=store)
    await core.start()
    try:
        for _ in range(200):
            if store._checks_crc is not None:
                break
            await asyncio.sleep(0.05)
        assert store._checks_crc is True, "the shard made no PUT, yet the probe should have run"
    finally:
        await core.stop()
        await core.meta.close()
        seaweed_server.delete_bucket(store.bucket)
