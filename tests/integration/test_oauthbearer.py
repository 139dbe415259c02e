"""SASL/OAUTHBEARER with confluent-kafka's oauth_cb and test-signed JWTs (docs/security.md): a good token
produces and consumes as its `sub`; an expired one, a wrong issuer or audience, and a bad signature are refused.
The JWKS is a file the test writes; replacing it rotates the keys without a restart."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from cryptography.hazmat.primitives.asymmetric import rsa

from kafscale.config import BrokerConfig
from kafscale.protocol.errors import ErrorCode
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.local_store import LocalDirStore
from kafscale.testing.inprocess import InProcessBroker
from tests.integration.test_security import call, closed, confluent_round_trip, expected, principals, raw, wait_for

ISSUER, AUDIENCE = "https://issuer.test", "kafka"


class Keys:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = uuid.uuid4().hex[:8]
        self.write()

    def write(self) -> None:
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        self.path.write_text(json.dumps({"keys": [{**jwk, "kid": self.kid, "use": "sig", "alg": "RS256"}]}))

    def rotate(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = uuid.uuid4().hex[:8]
        self.write()

    def token(self, sub: str = "svc-orders", *, lifetime_s: float = 300, issuer: str = ISSUER,
              audience: str = AUDIENCE, key: Any = None) -> tuple[str, float]:
        exp = time.time() + lifetime_s
        claims = {"sub": sub, "iss": issuer, "aud": audience, "exp": int(exp), "iat": int(time.time())}
        return jwt.encode(claims, key or self.key, algorithm="RS256", headers={"kid": self.kid}), exp


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return Keys(tmp_path_factory.mktemp("jwks") / "jwks.json")


@pytest.fixture(scope="module")
def broker(keys: Keys, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    d = tmp_path_factory.mktemp("oauth-broker")
    config = BrokerConfig(listeners="SASL_PLAINTEXT://127.0.0.1:0", sasl_enabled_mechanisms="OAUTHBEARER",
                          sasl_oauthbearer_jwks=str(keys.path), sasl_oauthbearer_issuer=ISSUER,
                          sasl_oauthbearer_audience=AUDIENCE, metrics_listen="", flush_interval_ms=20)
    with InProcessBroker(config, meta=lambda: EmbeddedStore(d / "meta.db"),
                         objects=lambda: LocalDirStore(d / "objects")) as b:
        yield b


def oauth(make_token: Callable[[], tuple[str, float]]) -> dict[str, Any]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "OAUTHBEARER",
            "oauth_cb": lambda _config: make_token()}


def test_a_valid_token_produces_and_consumes_as_its_subject(broker: InProcessBroker, keys: Keys) -> None:
    bootstrap = broker.bootstrap_for("SASL_PLAINTEXT")
    assert confluent_round_trip(bootstrap, oauth(lambda: keys.token("svc-orders"))) == expected()
    producer_side = AdminClient({"bootstrap.servers": bootstrap, **oauth(lambda: keys.token("svc-orders"))})
    assert producer_side.list_topics(timeout=10).brokers
    assert "User:svc-orders" in principals_of(broker)


def principals_of(broker: InProcessBroker) -> set[str]:
    from tests.integration.test_security import Secure

    return principals(Secure(broker, None), "SASL_PLAINTEXT")  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["expired", "issuer", "audience", "signature"])
def test_bad_tokens_are_refused(broker: InProcessBroker, keys: Keys, bad: str) -> None:
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    # An expired token, told to librdkafka as valid (it checks the expiry it is given, not the token's).
    make = {"expired": lambda: (keys.token(lifetime_s=-120)[0], time.time() + 300),  # past the 30 s skew
            "issuer": lambda: keys.token(issuer="https://evil.test"),
            "audience": lambda: keys.token(audience="not-kafka"),
            "signature": lambda: keys.token(key=other)}[bad]
    errors: list[KafkaError] = []
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_for("SASL_PLAINTEXT"), "error_cb": errors.append,
                         **oauth(make)})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=3)
    deadline = time.monotonic() + 30  # the refusal may come after list_topics gave up on a busy machine
    while not any(e.code() == KafkaError._AUTHENTICATION for e in errors) and time.monotonic() < deadline:
        admin.poll(0.5)  # serves error_cb
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), [e.str() for e in errors]


def test_the_refusal_is_an_error_challenge_then_the_failure_as_rfc_7628_says(broker: InProcessBroker,
                                                                           keys: Keys) -> None:
    token, _ = keys.token(lifetime_s=-120)
    with raw(broker.bootstrap_for("SASL_PLAINTEXT")) as s:
        assert call(s, 17, 1, mechanism="OAUTHBEARER").error_code == ErrorCode.none
        first = call(s, 36, 2, correlation_id=2, auth_bytes=f"n,,\x01auth=Bearer {token}\x01\x01".encode())
        assert first.error_code == ErrorCode.none and json.loads(first.auth_bytes) == {"status": "invalid_token"}
        final = call(s, 36, 2, correlation_id=3, auth_bytes=b"\x01")
        assert final.error_code == ErrorCode.sasl_authentication_failed and "invalid token" in final.error_message
        assert closed(s)


def test_the_session_ends_with_the_token_and_rotated_keys_apply_without_a_restart(broker: InProcessBroker,
                                                                                 keys: Keys) -> None:
    token, exp = keys.token(lifetime_s=60)
    with raw(broker.bootstrap_for("SASL_PLAINTEXT")) as s:
        assert call(s, 17, 1, mechanism="OAUTHBEARER").error_code == ErrorCode.none
        answer = call(s, 36, 2, correlation_id=2, auth_bytes=f"n,,\x01auth=Bearer {token}\x01\x01".encode())
        assert answer.error_code == ErrorCode.none
        assert 55 <= answer.session_lifetime.total_seconds() <= 60  # KIP-368: no longer than the token lives
    keys.rotate()
    bootstrap = broker.bootstrap_for("SASL_PLAINTEXT")
    wait_for(lambda: _logs_in(bootstrap, lambda: keys.token("svc-new")))
    assert not _logs_in(bootstrap, lambda: (token, exp))  # signed by the old key, now gone from the JWKS


def _logs_in(bootstrap: str, make: Callable[[], tuple[str, float]]) -> bool:
    admin = AdminClient({"bootstrap.servers": bootstrap, **oauth(make)})
    try:
        admin.list_topics(timeout=3)
        return True
    except KafkaException:
        return False
