"""SASL/OAUTHBEARER (RFC 7628, KIP-255 and KIP-768): the client presents a JWT; the broker checks its signature
against a JWKS (a file, reloaded when it changes, or an https URL, its keys cached), its expiry, and the issuer
and audience when configured. The principal is the token's `sub` claim (or the claim named). The session lasts at
most until the token expires: the client must re-authenticate with a new token before then (KIP-368).

A token that does not pass is answered as Kafka answers it: first an error challenge (`{"status":"invalid_token"}`,
RFC 7628 section 3.2.2), which the client acknowledges with a bare 0x01, then SASL_AUTHENTICATION_FAILED.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import jwt

from kafscale.security.principal import Principal
from kafscale.security.sasl import AuthFailed

log = logging.getLogger(__name__)

ASYMMETRIC = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
JWKS_URL_CACHE_S = 300.0


@dataclass(frozen=True, slots=True)
class OAuthSettings:
    jwks: str  # a file path, or an https:// (or http://) URL
    issuer: str = ""  # required `iss` when given
    audience: str = ""  # required among `aud` when given
    principal_claim: str = "sub"
    clock_skew_s: float = 30.0


class InvalidToken(Exception):
    """Why a token was refused (for the log and the client's error message; never the token itself)."""


class TokenValidator:
    def __init__(self, settings: OAuthSettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._client = jwt.PyJWKClient(settings.jwks, cache_keys=True, lifespan=JWKS_URL_CACHE_S) \
            if settings.jwks.startswith(("https://", "http://")) else None
        self._file_keys: jwt.PyJWKSet | None = None
        self._file_stamp: tuple[float, int] | None = None

    def _key(self, token: str) -> Any:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as e:
            raise InvalidToken(f"not a JWT: {e}") from None
        if header.get("alg") not in ASYMMETRIC:
            raise InvalidToken(f"signing algorithm {header.get('alg')!r} is not accepted (asymmetric ones only)")
        kid = header.get("kid")
        if self._client is not None:
            try:
                return self._client.get_signing_key_from_jwt(token).key if kid else \
                    self._client.get_signing_keys()[0].key
            except jwt.PyJWTError as e:
                raise InvalidToken(f"no signing key for it in the JWKS: {e}") from None
        keys = self._file_jwks()
        for k in keys.keys:
            if kid is None or k.key_id == kid:
                return k.key
        raise InvalidToken(f"no key {kid!r} in the JWKS")

    def _file_jwks(self) -> jwt.PyJWKSet:
        with self._lock:
            try:
                st = os.stat(self.settings.jwks)
                stamp = (st.st_mtime, st.st_size)
                if stamp != self._file_stamp or self._file_keys is None:
                    with open(self.settings.jwks, encoding="utf-8") as f:
                        self._file_keys = jwt.PyJWKSet.from_json(f.read())
                    self._file_stamp = stamp
            except (OSError, jwt.PyJWTError, ValueError) as e:
                if self._file_keys is None:
                    raise InvalidToken(f"the JWKS {self.settings.jwks} cannot be read: {e}") from None
                log.warning("JWKS %s changed but cannot be read (kept the previous keys): %s", self.settings.jwks, e)
            assert self._file_keys is not None
            return self._file_keys

    def validate(self, token: str) -> tuple[str, float]:
        """(principal name, expiry as time.time()); InvalidToken says why not. Blocking (a URL may be fetched)."""
        s = self.settings
        key = self._key(token)
        try:
            claims = jwt.decode(token, key, algorithms=list(ASYMMETRIC), audience=s.audience or None,
                                issuer=s.issuer or None, leeway=s.clock_skew_s,
                                options={"require": ["exp", s.principal_claim], "verify_aud": bool(s.audience)})
        except jwt.PyJWTError as e:
            raise InvalidToken(str(e)) from None
        name = claims.get(s.principal_claim)
        if not isinstance(name, str) or not name:
            raise InvalidToken(f"claim {s.principal_claim!r} is not a non-empty string")
        return name, float(claims["exp"])


class OAuthBearerExchange:
    def __init__(self, validator: TokenValidator) -> None:
        self._validator = validator
        self._refused: str | None = None
        self.principal: Principal | None = None
        self.expires_at: float | None = None

    async def step(self, data: bytes) -> bytes:
        if self._refused is not None:  # the client acknowledged the error challenge
            raise AuthFailed(f"Authentication failed: {self._refused}")
        token = _token(data)
        try:
            name, expires_at = await asyncio.to_thread(self._validator.validate, token)
        except InvalidToken as e:
            self._refused = f"invalid token: {e}"
            return json.dumps({"status": "invalid_token"}).encode()
        if expires_at <= time.time():
            self._refused = "the token has expired"
            return json.dumps({"status": "invalid_token"}).encode()
        self.principal, self.expires_at = Principal(name), expires_at
        return b""


def _token(data: bytes) -> str:
    """The bearer token of an RFC 7628 initial client response: `gs2-header 0x01 auth=Bearer TOKEN 0x01 ... 0x01`."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise AuthFailed("Authentication failed: the OAUTHBEARER message is not UTF-8") from None
    _, sep, rest = text.partition("\x01")
    if not sep:
        raise AuthFailed("Authentication failed: malformed OAUTHBEARER message")
    for pair in rest.split("\x01"):
        key, _, value = pair.partition("=")
        if key == "auth":
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    raise AuthFailed("Authentication failed: no bearer token in the OAUTHBEARER message")
