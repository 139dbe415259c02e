"""A connection's SASL state (kafscale/security/sasl.py) and the failure throttle, on real stored credentials."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kafscale.security import credentials
from kafscale.security.credentials import Credentials
from kafscale.security.principal import Principal
from kafscale.security.sasl import AuthFailed, SaslSession, SaslSettings
from kafscale.security.scram import Mechanism, ScramCredential
from kafscale.security.throttle import BASE_DELAY_S, FORGET_S, MAX_DELAY_S, FailureThrottle
from kafscale.storage.embedded_store import EmbeddedStore

ALL = SaslSettings(("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"))


@contextlib.asynccontextmanager
async def users(tmp_path: Path, **passwords: str) -> AsyncIterator[tuple[EmbeddedStore, Credentials]]:
    """A store holding these users' credentials, and a running mirror of them (stopped and closed after)."""
    meta = EmbeddedStore(tmp_path / "meta.db")
    for user, password in passwords.items():
        for m in Mechanism:
            await credentials.upsert(meta, user, ScramCredential.from_password(m, password))
    found = Credentials(meta)
    await found.start()
    try:
        yield meta, found
    finally:
        await found.stop()
        await meta.close()


async def scram_login(session: SaslSession, user: str, password: str, mechanism: Mechanism) -> bytes:
    """A SCRAM client's two steps (RFC 5802), against the session."""
    assert session.handshake(mechanism.sasl_name)
    first_bare = f"n={user},r=clientnonce"
    server_first = (await session.authenticate(f"n,,{first_bare}".encode())).data.decode()
    attrs = dict(kv.split("=", 1) for kv in server_first.split(","))
    salted = hashlib.pbkdf2_hmac(mechanism.digest, password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"]))
    client_key = hmac.new(salted, b"Client Key", mechanism.digest).digest()
    without_proof = f"c=biws,r={attrs['r']}"
    auth = f"{first_bare},{server_first},{without_proof}".encode()
    signature = hmac.new(hashlib.new(mechanism.digest, client_key).digest(), auth, mechanism.digest).digest()
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature, strict=True))).decode()
    step = await session.authenticate(f"{without_proof},p={proof}".encode())
    assert step.done
    return step.data


async def test_scram_and_plain_log_in_and_set_the_principal(tmp_path: Path) -> None:
    async with users(tmp_path, alice="pw-a") as (_, found):
        for mechanism in Mechanism:
            session = SaslSession(ALL, found)
            assert (await scram_login(session, "alice", "pw-a", mechanism)).startswith(b"v=")
            assert session.principal == Principal("alice") and session.expires_at is None
        session = SaslSession(ALL, found)
        assert session.handshake("PLAIN")
        assert (await session.authenticate(b"\0alice\0pw-a")).done and session.principal == Principal("alice")
        for bad in (b"\0alice\0pw-b", b"\0nobody\0pw-a", b"bob\0alice\0pw-a", b"alice\0pw-a", b"\0\xff\0x"):
            session = SaslSession(ALL, found)
            assert session.handshake("PLAIN")
            with pytest.raises(AuthFailed, match="Authentication failed"):
                await session.authenticate(bad)
            assert session.principal is None


async def test_only_enabled_mechanisms_are_taken(tmp_path: Path) -> None:
    async with users(tmp_path) as (_, found):
        session = SaslSession(SaslSettings(("SCRAM-SHA-512",)), found)
        assert not session.handshake("PLAIN") and not session.handshake("GSSAPI")
        assert session.handshake("SCRAM-SHA-512")


async def test_a_session_lives_connections_max_reauth_ms_and_reauthentication_keeps_the_principal(
        tmp_path: Path) -> None:
    async with users(tmp_path, alice="pw-a", bob="pw-b") as (_, found):
        session = SaslSession(SaslSettings(("SCRAM-SHA-256",), reauth_ms=60_000), found)
        await scram_login(session, "alice", "pw-a", Mechanism.SCRAM_SHA_256)
        assert session.expires_at is not None and not session.expired()
        assert session.expired(session.expires_at + 0.001)
        await scram_login(session, "alice", "pw-a", Mechanism.SCRAM_SHA_256)  # re-authenticated: a new lifetime
        assert session.principal == Principal("alice")
        with pytest.raises(AuthFailed, match="Re-authentication must keep the principal User:alice"):
            await scram_login(session, "bob", "pw-b", Mechanism.SCRAM_SHA_256)


async def test_a_new_credential_reaches_the_mirror_through_the_stores_watch(tmp_path: Path) -> None:
    async with users(tmp_path) as (meta, found):
        assert found.any_of("carol") is None
        await credentials.upsert(meta, "carol", ScramCredential.from_password(Mechanism.SCRAM_SHA_256, "pw"))
        for _ in range(100):
            if found.any_of("carol") is not None:
                break
            await asyncio.sleep(0.01)
        assert found.lookup("carol", Mechanism.SCRAM_SHA_256) is not None
        await credentials.delete(meta, "carol", Mechanism.SCRAM_SHA_256)
        for _ in range(100):
            if found.any_of("carol") is None:
                break
            await asyncio.sleep(0.01)
        assert found.any_of("carol") is None


def test_failures_from_one_address_are_answered_ever_more_slowly_up_to_the_cap() -> None:
    now = [0.0]
    throttle = FailureThrottle(clock=lambda: now[0])
    delays = [throttle.failed("10.0.0.1") for _ in range(100)]
    assert delays[0] == BASE_DELAY_S and delays[10] == 2 * BASE_DELAY_S and delays[-1] == MAX_DELAY_S
    assert delays == sorted(delays)
    assert throttle.failed("10.0.0.2") == BASE_DELAY_S  # another address starts afresh
    now[0] += FORGET_S + 1
    assert throttle.failed("10.0.0.1") == BASE_DELAY_S  # forgotten after a quiet minute
    assert throttle.total == 102
