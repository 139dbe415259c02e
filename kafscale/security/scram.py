"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka runs them: the credential kept per user and
mechanism, and the server's side of one exchange.

Only StoredKey and ServerKey are kept, with the salt and iteration count: neither the password nor anything
that logs in without it (the salted password is what AlterUserScramCredentials carries, and is not kept).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

MIN_ITERATIONS = 4096  # Kafka's bounds for SCRAM credentials
MAX_ITERATIONS = 16384


class Mechanism(Enum):
    SCRAM_SHA_256 = ("SCRAM-SHA-256", "sha256", 1)
    SCRAM_SHA_512 = ("SCRAM-SHA-512", "sha512", 2)

    def __init__(self, sasl_name: str, digest: str, kafka_type: int) -> None:
        self.sasl_name = sasl_name
        self.digest = digest
        self.kafka_type = kafka_type  # the mechanism's number in Describe/AlterUserScramCredentials

    @classmethod
    def named(cls, name: str) -> Mechanism:
        for m in cls:
            if m.sasl_name == name.upper():
                return m
        raise ValueError(f"unknown SCRAM mechanism {name!r} (SCRAM-SHA-256 or SCRAM-SHA-512)")

    @classmethod
    def of_type(cls, kafka_type: int) -> Mechanism | None:
        return next((m for m in cls if m.kafka_type == kafka_type), None)

    def hmac(self, key: bytes, message: bytes) -> bytes:
        return hmac.new(key, message, self.digest).digest()

    def hash(self, data: bytes) -> bytes:
        return hashlib.new(self.digest, data).digest()

    def salted_password(self, password: str, salt: bytes, iterations: int) -> bytes:
        return hashlib.pbkdf2_hmac(self.digest, password.encode(), salt, iterations)


@dataclass(frozen=True, slots=True)
class ScramCredential:
    mechanism: Mechanism
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @classmethod
    def from_salted_password(cls, mechanism: Mechanism, salt: bytes, iterations: int,
                             salted_password: bytes) -> ScramCredential:
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise ValueError(f"iterations must be in [{MIN_ITERATIONS}, {MAX_ITERATIONS}], got {iterations}")
        if not salt:
            raise ValueError("the salt is empty")
        client_key = mechanism.hmac(salted_password, b"Client Key")
        return cls(mechanism, salt, iterations, mechanism.hash(client_key),
                   mechanism.hmac(salted_password, b"Server Key"))

    @classmethod
    def from_password(cls, mechanism: Mechanism, password: str, iterations: int = MIN_ITERATIONS,
                      salt: bytes | None = None) -> ScramCredential:
        salt = salt or os.urandom(32)
        return cls.from_salted_password(mechanism, salt, iterations,
                                        mechanism.salted_password(password, salt, iterations))

    def checks_password(self, password: str) -> bool:
        """For SASL/PLAIN against the same credential (PBKDF2: milliseconds; run it off the event loop)."""
        salted = self.mechanism.salted_password(password, self.salt, self.iterations)
        return hmac.compare_digest(self.mechanism.hash(self.mechanism.hmac(salted, b"Client Key")), self.stored_key)

    def to_value(self) -> dict[str, object]:
        return {"mechanism": self.mechanism.sasl_name, "iterations": self.iterations,
                "salt": _b64(self.salt), "stored_key": _b64(self.stored_key), "server_key": _b64(self.server_key)}

    @classmethod
    def from_value(cls, value: dict[str, object]) -> ScramCredential:
        return cls(Mechanism.named(str(value["mechanism"])), _unb64(value["salt"]), int(value["iterations"]),  # type: ignore[call-overload]
                   _unb64(value["stored_key"]), _unb64(value["server_key"]))


class ScramError(Exception):
    """The exchange failed; the message is safe to send to the client (it never says which part was wrong)."""


class ScramExchange:
    """The server's side of one SCRAM exchange: client-first -> server-first, client-final -> server-final.

    `lookup(user)` gives the user's credential for this mechanism, or None. An unknown user gets a made-up
    salt and fails at the proof, as a wrong password does, so the exchange does not tell who exists.
    """

    def __init__(self, mechanism: Mechanism, lookup: Callable[[str], ScramCredential | None],
                 nonce: Callable[[], str] = lambda: secrets.token_urlsafe(24)) -> None:
        self.mechanism = mechanism
        self._lookup = lookup
        self._make_nonce = nonce  # the server's part of the nonce (given in tests, to check RFC 7677's example)
        self.user: str | None = None
        self._credential: ScramCredential | None = None
        self._nonce = ""
        self._client_nonce = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._gs2_header = ""
        self.done = False

    def step(self, message: bytes) -> bytes:
        if not self._server_first:
            return self._first(message)
        if self.done:
            raise ScramError("the exchange is over")
        return self._final(message)

    def _first(self, message: bytes) -> bytes:
        text = _text(message)
        parts = text.split(",", 2)
        if len(parts) != 3 or parts[0] not in ("n", "y") or (parts[1] and not parts[1].startswith("a=")):
            raise ScramError("malformed client-first message")
        self._gs2_header = f"{parts[0]},{parts[1]},"
        bare = parts[2]
        attrs = _attributes(bare)
        if "m" in attrs:
            raise ScramError("SCRAM extensions are not supported")
        if "n" not in attrs or "r" not in attrs or not attrs["r"]:
            raise ScramError("malformed client-first message")
        if any(k not in ("n", "r") for k in attrs):
            # Kafka's only extension is tokenauth=true (delegation tokens), which this broker does not issue.
            raise ScramError("SCRAM extensions are not supported")
        self.user = _unescape(attrs["n"])
        credential = self._lookup(self.user)
        if credential is None:  # a stand-in that no proof can match
            credential = ScramCredential(self.mechanism, self.mechanism.hash(b"salt:" + self.user.encode()),
                                         MIN_ITERATIONS, secrets.token_bytes(64), secrets.token_bytes(64))
        self._credential = credential
        self._client_nonce = attrs["r"]
        self._nonce = self._client_nonce + self._make_nonce()
        self._client_first_bare = bare
        self._server_first = f"r={self._nonce},s={_b64(credential.salt)},i={credential.iterations}"
        return self._server_first.encode()

    def _final(self, message: bytes) -> bytes:
        assert self._credential is not None
        text = _text(message)
        without_proof, sep, proof_part = text.rpartition(",p=")
        if not sep:
            raise ScramError("malformed client-final message")
        attrs = _attributes(without_proof)
        # librdkafka before 2.6.1 sends its own nonce again in front of the combined one (librdkafka#4895).
        # Kafka 3.8.1+ accepts that too; it still proves the client saw this exchange's server nonce.
        if attrs.get("r") not in (self._nonce, self._client_nonce + self._nonce):
            raise ScramError("the nonce does not match")
        try:
            channel = base64.b64decode(attrs.get("c", ""), validate=True).decode()
            proof = base64.b64decode(proof_part, validate=True)
        except (ValueError, UnicodeDecodeError):
            raise ScramError("malformed client-final message") from None
        if channel != self._gs2_header:
            raise ScramError("channel binding does not match")
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        m = self._credential.mechanism
        signature = m.hmac(self._credential.stored_key, auth_message)
        if len(proof) != len(signature):
            raise ScramError("authentication failed: invalid credentials")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(m.hash(client_key), self._credential.stored_key):
            raise ScramError("authentication failed: invalid credentials")
        self.done = True
        return f"v={_b64(m.hmac(self._credential.server_key, auth_message))}".encode()


def _text(message: bytes) -> str:
    try:
        return message.decode()
    except UnicodeDecodeError:
        raise ScramError("the SCRAM message is not UTF-8") from None


def _attributes(text: str) -> dict[str, str]:
    attrs: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or len(key) != 1:
            raise ScramError("malformed SCRAM message")
        attrs[key] = value
    return attrs


def _unescape(name: str) -> str:
    if "=" in name.replace("=2C", "").replace("=3D", ""):
        raise ScramError("malformed user name")
    return name.replace("=2C", ",").replace("=3D", "=")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(value: object) -> bytes:
    return base64.b64decode(str(value))
