"""SASL on a connection: SaslHandshake picks a mechanism, SaslAuthenticate runs its exchange (KIP-152), and the
result is the connection's principal for as long as its session lasts (KIP-368 re-authentication).

Mechanisms: PLAIN and SCRAM-SHA-256/512 against the stored SCRAM credentials (kafscale.security.credentials),
OAUTHBEARER against a JWKS (kafscale.security.oauthbearer). A failed exchange is answered after a delay that
grows with the failures from the same address (kafscale.security.throttle), then the connection closes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from kafscale.security.credentials import Credentials
from kafscale.security.principal import Principal
from kafscale.security.scram import MIN_ITERATIONS, Mechanism, ScramCredential, ScramError, ScramExchange

log = logging.getLogger(__name__)

PLAIN = "PLAIN"
OAUTHBEARER = "OAUTHBEARER"


class AuthFailed(Exception):
    """The exchange failed; the message is what the client is told (it never says which part was wrong)."""


class Exchange(Protocol):
    """One mechanism's server side: fed the client's bytes, answers the server's, until `principal` is set."""

    principal: Principal | None
    expires_at: float | None  # time.time() when the credential itself expires (a token's exp), if it does

    async def step(self, data: bytes) -> bytes: ...


_DECOY = ScramCredential.from_password(Mechanism.SCRAM_SHA_512, "decoy", MIN_ITERATIONS, b"decoy-salt")


class PlainExchange:
    """RFC 4616: `authzid NUL user NUL password`, checked against the user's SCRAM credential (PBKDF2 on a
    thread: milliseconds of CPU that the event loop must not spend)."""

    def __init__(self, credentials: Credentials) -> None:
        self._credentials = credentials
        self.principal: Principal | None = None
        self.expires_at: float | None = None

    async def step(self, data: bytes) -> bytes:
        parts = data.split(b"\0")
        if len(parts) != 3:
            raise AuthFailed("Authentication failed: invalid PLAIN message")
        try:
            authzid, user, password = (p.decode() for p in parts)
        except UnicodeDecodeError:
            raise AuthFailed("Authentication failed: invalid PLAIN message") from None
        if authzid and authzid != user:
            raise AuthFailed("Authentication failed: the authorization id must be the user name")
        credential = self._credentials.any_of(user)
        # An unknown user costs the same PBKDF2 as a known one: the time taken does not tell who exists.
        ok = await asyncio.to_thread((credential or _DECOY).checks_password, password)
        if not (credential is not None and ok):
            raise AuthFailed("Authentication failed: Invalid username or password")
        self.principal = Principal(user)
        return b""


class ScramServerExchange:
    def __init__(self, mechanism: Mechanism, credentials: Credentials) -> None:
        self._exchange = ScramExchange(mechanism, credentials.lookup_for(mechanism))
        self.principal: Principal | None = None
        self.expires_at: float | None = None

    async def step(self, data: bytes) -> bytes:
        try:
            out = self._exchange.step(data)
        except ScramError as e:
            raise AuthFailed(f"Authentication failed during authentication due to invalid credentials with SASL "
                             f"mechanism {self._exchange.mechanism.sasl_name}: {e}") from None
        if self._exchange.done:
            assert self._exchange.user is not None
            self.principal = Principal(self._exchange.user)
        return out


@dataclass(frozen=True, slots=True)
class SaslSettings:
    mechanisms: tuple[str, ...]  # enabled, in the order SaslHandshake lists them
    reauth_ms: int = 0  # connections.max.reauth.ms: 0 = a session never expires
    oauthbearer: Callable[[], Exchange] | None = None  # makes an OAUTHBEARER exchange (None: not configured)


@dataclass(frozen=True, slots=True)
class Step:
    """What SaslAuthenticate answers: the server's bytes, and once done, the session's lifetime."""

    data: bytes
    done: bool
    lifetime_ms: int = 0


class SaslSession:
    """A connection's SASL state: waiting for a handshake, in an exchange, or authenticated (and perhaps
    re-authenticating, which must end with the same principal)."""

    def __init__(self, settings: SaslSettings, credentials: Credentials) -> None:
        self.settings = settings
        self._credentials = credentials
        self._exchange: Exchange | None = None
        self.mechanism: str | None = None
        self.principal: Principal | None = None  # set once authenticated; kept while re-authenticating
        self.expires_at: float | None = None  # time.monotonic() when the session ends (None: never)
        self.raw_tokens = False  # after a v0 SaslHandshake: the next frames are bare tokens (KIP-43)
        self.failed = False  # answered a failure: the connection closes after that answer

    @property
    def authenticated(self) -> bool:
        return self.principal is not None

    @property
    def in_exchange(self) -> bool:
        return self._exchange is not None

    def expired(self, now: float | None = None) -> bool:
        return self.expires_at is not None and (now if now is not None else time.monotonic()) >= self.expires_at

    def handshake(self, mechanism: str) -> bool:
        """SaslHandshake: True if the mechanism is enabled (then SaslAuthenticate runs its exchange)."""
        if mechanism not in self.settings.mechanisms:
            return False
        if mechanism == PLAIN:
            self._exchange = PlainExchange(self._credentials)
        elif mechanism == OAUTHBEARER:
            if self.settings.oauthbearer is None:
                return False
            self._exchange = self.settings.oauthbearer()
        else:
            self._exchange = ScramServerExchange(Mechanism.named(mechanism), self._credentials)
        self.mechanism = mechanism
        return True

    async def authenticate(self, data: bytes) -> Step:
        """One SaslAuthenticate. Raises AuthFailed (the connection answers it, then closes)."""
        exchange = self._exchange
        if exchange is None:
            raise AuthFailed("SaslAuthenticate before SaslHandshake")
        try:
            out = await exchange.step(data)
        except AuthFailed:
            self._exchange = None
            raise
        if exchange.principal is None:
            return Step(out, done=False)
        self._exchange = None
        if self.principal is not None and exchange.principal != self.principal:
            raise AuthFailed(f"Re-authentication must keep the principal {self.principal}, "
                             f"not change it to {exchange.principal}")
        self.principal = exchange.principal
        lifetime_ms = self._lifetime_ms(exchange.expires_at)
        self.expires_at = time.monotonic() + lifetime_ms / 1000 if lifetime_ms else None
        return Step(out, done=True, lifetime_ms=lifetime_ms)

    def _lifetime_ms(self, credential_expires_at: float | None) -> int:
        limits = []
        if self.settings.reauth_ms > 0:
            limits.append(self.settings.reauth_ms)
        if credential_expires_at is not None:
            limits.append(max(int((credential_expires_at - time.time()) * 1000), 1))
        return min(limits) if limits else 0

