"""SCRAM (kafscale/security/scram.py) against RFC 7677's worked example, and what must fail."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from kafscale.security.scram import Mechanism, ScramCredential, ScramError, ScramExchange

# RFC 7677, section 3: user "user", password "pencil".
SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
SERVER_FIRST = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
PENCIL = ScramCredential.from_password(Mechanism.SCRAM_SHA_256, "pencil", 4096, SALT)


def exchange(credential: ScramCredential | None = PENCIL) -> ScramExchange:
    return ScramExchange(Mechanism.SCRAM_SHA_256, lambda user: credential if user == "user" else None,
                         nonce=lambda: SERVER_NONCE)


def test_the_rfc_7677_example_runs_through_to_the_servers_signature() -> None:
    server = exchange()
    assert server.step(CLIENT_FIRST) == SERVER_FIRST
    assert server.step(CLIENT_FINAL) == SERVER_FINAL
    assert server.done and server.user == "user"


def test_a_wrong_password_fails_at_the_proof() -> None:
    server = exchange(ScramCredential.from_password(Mechanism.SCRAM_SHA_256, "pen", 4096, SALT))
    assert server.step(CLIENT_FIRST) == SERVER_FIRST  # the same salt: nothing tells the client yet
    with pytest.raises(ScramError, match="invalid credentials"):
        server.step(CLIENT_FINAL)
    assert not server.done


def test_an_unknown_user_gets_a_salt_and_fails_like_a_wrong_password() -> None:
    server = ScramExchange(Mechanism.SCRAM_SHA_256, lambda user: None, nonce=lambda: SERVER_NONCE)
    first = server.step(CLIENT_FIRST)
    assert first.startswith(b"r=rOprNGfwEbeRWgbNEkqO" + SERVER_NONCE.encode() + b",s=") and first.endswith(b",i=4096")
    with pytest.raises(ScramError, match="invalid credentials"):
        server.step(CLIENT_FINAL)


@pytest.mark.parametrize("first", [b"", b"x,,n=user,r=abc", b"n,,n=user", b"n,,r=abc", b"n,,n=user,r=abc,m=ext",
                                   b"n,,n=us=er,r=abc", b"\xff\xfe", b"p=tls-unique,,n=user,r=abc"])
def test_malformed_first_messages_are_refused(first: bytes) -> None:
    with pytest.raises(ScramError):
        exchange().step(first)


@pytest.mark.parametrize("final", [b"c=biws,r=wrong-nonce,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
                                   b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
                                   b"c=eSws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=AAAA",
                                   b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=!!"])
def test_malformed_or_mismatched_final_messages_are_refused(final: bytes) -> None:
    server = exchange()
    server.step(CLIENT_FIRST)
    with pytest.raises(ScramError):
        server.step(final)


def _client_final(nonce: str, password: bytes = b"pencil") -> bytes:
    """A client-final message for RFC 7677's exchange with the nonce given, its proof computed as a client does."""
    without_proof = f"c=biws,r={nonce}"
    auth_message = b",".join((CLIENT_FIRST[3:], SERVER_FIRST, without_proof.encode()))
    salted = hashlib.pbkdf2_hmac("sha256", password, SALT, 4096)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    signature = hmac.digest(hashlib.sha256(client_key).digest(), auth_message, "sha256")
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


def test_librdkafka_before_2_6_1_sending_its_nonce_twice_is_accepted_and_nothing_else_is() -> None:
    combined = "rOprNGfwEbeRWgbNEkqO" + SERVER_NONCE
    assert _client_final(combined) == CLIENT_FINAL  # the helper computes RFC 7677's proof
    server = exchange()
    server.step(CLIENT_FIRST)
    assert server.step(_client_final("rOprNGfwEbeRWgbNEkqO" + combined)).startswith(b"v=")  # librdkafka#4895
    assert server.done
    for nonce in ("x" + combined, "rOprNGfwEbeRWgbNEkqO", combined + "x", "rOprNGfwEbeRWgbNEkqOrOprNGfwEbeRWgbNEkqO"):
        server = exchange()
        server.step(CLIENT_FIRST)
        with pytest.raises(ScramError, match="nonce"):
            server.step(_client_final(nonce))


def test_user_names_are_unescaped_as_rfc_5802_says() -> None:
    seen: list[str] = []
    server = ScramExchange(Mechanism.SCRAM_SHA_512, lambda user: seen.append(user), nonce=lambda: "n")  # type: ignore[func-returns-value]
    server.step(b"n,,n=a=2Cb=3Dc,r=x")
    assert seen == ["a,b=c"]


def test_a_stored_credential_reads_back_and_checks_only_its_password() -> None:
    credential = ScramCredential.from_password(Mechanism.SCRAM_SHA_512, "s3cret", 8192)
    again = ScramCredential.from_value(credential.to_value())
    assert again == credential
    assert "s3cret" not in repr(credential.to_value())
    assert again.checks_password("s3cret") and not again.checks_password("s3cret ")


@pytest.mark.parametrize("iterations", [4095, 16385])
def test_iterations_outside_kafkas_bounds_are_refused(iterations: int) -> None:
    with pytest.raises(ValueError, match="iterations"):
        ScramCredential.from_password(Mechanism.SCRAM_SHA_256, "x", iterations)
