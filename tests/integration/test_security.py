"""Listeners, TLS and SASL with real clients over real TCP (docs/security.md).

One broker serves four listeners: PLAINTEXT, SSL (client certificates requested: mTLS), SASL_PLAINTEXT and
SASL_SSL, with certificates made by a test CA (trustme) and users created through Kafka's own admin API
(AlterUserScramCredentials) or the store. Sessions, failures and abuse are tested here against confluent-kafka
and raw requests (every client over every protocol: test_security_clients.py). Wrong passwords, requests before
authentication, plaintext on a TLS port and garbage handshakes are refused while the broker and its other
clients go on.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import socket
import ssl
import struct
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

from kafscale.config import BrokerConfig, ConfigError
from kafscale.protocol import FrameBuffer, decode_response, encode_request, make, request_class
from kafscale.protocol.errors import ErrorCode
from kafscale.security import credentials
from kafscale.security.principal import Principal
from kafscale.security.scram import Mechanism, ScramCredential
from kafscale.security.throttle import MAX_DELAY_S
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.local_store import LocalDirStore
from kafscale.testing.inprocess import InProcessBroker
from kafscale.testing.serve_process import START_TIMEOUT_S, ServeProcess
from tests.integration.pki import ALICE_RULE, PASSWORD, USER, Pki, make_pki

LISTENERS = "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0"


@dataclass
class Secure:
    broker: InProcessBroker
    pki: Pki

    def at(self, listener: str) -> str:
        return self.broker.bootstrap_for(listener)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secure(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    d = tmp_path_factory.mktemp("secure-broker")
    config = BrokerConfig(listeners=LISTENERS, ssl_certfile=str(pki.cert_file), ssl_keyfile=str(pki.key_file),
                          ssl_cafile=str(pki.ca_file), ssl_client_auth="requested",
                          ssl_principal_mapping_rules=ALICE_RULE,
                          metrics_listen="", flush_interval_ms=20)
    broker = InProcessBroker(config, meta=lambda: EmbeddedStore(d / "meta.db"),
                             objects=lambda: LocalDirStore(d / "objects"))
    with broker:
        for mechanism in Mechanism:  # the first user, made against the store as `kafscale user create` does
            broker.run(credentials.upsert(broker.shard.core.meta, USER,  # type: ignore[union-attr]
                                          ScramCredential.from_password(mechanism, PASSWORD)))
        wait_for(lambda: broker.shard.core.credentials.any_of(USER) is not None)  # type: ignore[union-attr]
        yield Secure(broker, pki)


def wait_for(check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def topic() -> str:
    return f"sec-{uuid.uuid4().hex[:10]}"


# ------------------------------------------------------------------------------------ clients


def confluent_round_trip(bootstrap: str, settings: dict[str, Any], n: int = 20, deadline_s: float = 30) -> list[bytes]:
    name = topic()
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, **settings})
    for i in range(n):
        producer.produce(name, value=f"v{i}".encode())
    assert producer.flush(deadline_s) == 0, "not every record was acknowledged"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{name}", "auto.offset.reset": "earliest",
                         **settings})
    try:
        consumer.subscribe([name])
        got: list[bytes] = []
        deadline = time.monotonic() + deadline_s
        while len(got) < n and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.append(message.value())
        return got
    finally:
        consumer.close()


def confluent_ssl(pki: Pki, client_cert: bool = False) -> dict[str, Any]:
    settings = {"security.protocol": "SSL", "ssl.ca.location": str(pki.ca_file)}
    if client_cert:
        settings |= {"ssl.certificate.location": str(pki.client_cert), "ssl.key.location": str(pki.client_key)}
    return settings


def confluent_sasl(protocol: str, mechanism: str, pki: Pki, user: str = USER,
                   password: str = PASSWORD) -> dict[str, Any]:
    settings = {"security.protocol": protocol, "sasl.mechanisms": mechanism, "sasl.username": user,
                "sasl.password": password}
    if protocol == "SASL_SSL":
        settings["ssl.ca.location"] = str(pki.ca_file)
    return settings


def expected(n: int = 20) -> list[bytes]:
    return [f"v{i}".encode() for i in range(n)]


def principals(secure: Secure, listener: str) -> set[str]:
    shard = secure.broker.shard
    assert shard is not None
    found = next(li for li in shard.listeners if li.name == listener)
    return {str(c.sasl.principal if c.sasl is not None else c.principal) for c in list(found._connections)}


# ------------------------------------------------------------------------------------ TLS


def test_confluent_over_ssl_with_and_without_a_client_certificate(secure: Secure) -> None:
    assert confluent_round_trip(secure.at("SSL"), confluent_ssl(secure.pki)) == expected()
    producer = Producer({"bootstrap.servers": secure.at("SSL"), **confluent_ssl(secure.pki, client_cert=True)})
    producer.produce(topic(), b"x")
    assert producer.flush(30) == 0
    # The mapping rule takes the certificate's CN=alice,OU=ServiceUsers,... to User:alice.
    assert str(Principal(USER)) in principals(secure, "SSL")


def test_metadata_gives_the_addresses_of_the_listener_the_client_came_in_on(secure: Secure) -> None:
    for listener, settings in [("SSL", confluent_ssl(secure.pki)), ("PLAINTEXT", {}),
                               ("SASL_SSL", confluent_sasl("SASL_SSL", "PLAIN", secure.pki))]:
        admin = AdminClient({"bootstrap.servers": secure.at(listener), **settings})
        brokers = admin.list_topics(timeout=15).brokers
        assert [f"{b.host}:{b.port}" for b in brokers.values()] == [secure.at(listener)], listener


def test_plaintext_to_a_tls_port_and_a_garbage_handshake_are_dropped_and_the_broker_goes_on(secure: Secure) -> None:
    host, port = secure.at("SSL").split(":")
    api_versions = encode_request(make(request_class(18, 0)), correlation_id=1, client_id="raw")
    for junk in (api_versions, b"\x16\x03\x01\x00\x05hello" + bytes(range(256)) * 4, b"\x00" * 10_000):
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(junk)
            assert closed(s)  # after at most a TLS alert: never a Kafka answer
    assert confluent_round_trip(secure.at("SSL"), confluent_ssl(secure.pki)) == expected()


def test_a_client_that_does_not_trust_the_broker_fails_to_connect(secure: Secure, tmp_path: Path) -> None:
    other = trustme.CA()
    other.cert_pem.write_to_path(str(tmp_path / "other.pem"))
    admin = AdminClient({"bootstrap.servers": secure.at("SSL"), "security.protocol": "SSL",
                         "ssl.ca.location": str(tmp_path / "other.pem")})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)


# ------------------------------------------------------------------------------------ SASL


def test_a_wrong_password_is_refused_and_the_right_one_still_works(secure: Secure) -> None:
    for mechanism in ("PLAIN", "SCRAM-SHA-512"):
        errors: list[KafkaError] = []
        admin = AdminClient({"bootstrap.servers": secure.at("SASL_SSL"), "error_cb": errors.append,
                             **confluent_sasl("SASL_SSL", mechanism, secure.pki, password="wrong")})
        with pytest.raises(KafkaException):
            admin.list_topics(timeout=3)
        deadline = time.monotonic() + 30  # the refusal may come after list_topics gave up on a busy machine
        while not _refused(errors) and time.monotonic() < deadline:
            admin.poll(0.5)  # serves error_cb
        assert _refused(errors), [e.str() for e in errors]
    assert confluent_round_trip(secure.at("SASL_SSL"), confluent_sasl("SASL_SSL", "PLAIN", secure.pki)) == expected()


def _refused(errors: list[KafkaError]) -> bool:
    return any(e.code() == KafkaError._AUTHENTICATION and "Authentication failed" in e.str() for e in errors)


def test_users_made_and_described_through_the_admin_api_can_log_in(secure: Secure) -> None:
    admin = AdminClient({"bootstrap.servers": secure.at("SASL_SSL"),
                         **confluent_sasl("SASL_SSL", "SCRAM-SHA-256", secure.pki)})
    user = f"bob-{uuid.uuid4().hex[:6]}"
    futures = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), b"bob-password", b"bob-salt-123")])
    futures[user].result(15)
    info = admin.describe_user_scram_credentials([user])[user].result(15).scram_credential_infos
    assert [(i.mechanism, i.iterations) for i in info] == [(ScramMechanism.SCRAM_SHA_512, 8192)]
    settings = confluent_sasl("SASL_SSL", "SCRAM-SHA-512", secure.pki, user=user, password="bob-password")
    wait_for(lambda: secure.broker.shard.core.credentials.any_of(user) is not None)  # type: ignore[union-attr]
    assert confluent_round_trip(secure.at("SASL_SSL"), settings) == expected()


# ------------------------------------------------------------------------------------ the wire


def raw(host_port: str) -> socket.socket:
    host, port = host_port.split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def call(s: socket.socket, api_key: int, version: int, correlation_id: int = 1, **fields: Any) -> Any:
    s.sendall(encode_request(make(request_class(api_key, version), **fields), correlation_id=correlation_id,
                             client_id="raw"))
    buf, frames = FrameBuffer(), []
    while not frames:
        chunk = s.recv(65536)
        assert chunk, "the broker closed the connection"
        frames = buf.feed(chunk)
    return decode_response(api_key, version, frames[0])[1]


def closed(s: socket.socket) -> bool:
    """True once the broker has closed the connection; what it sends first must not be a Kafka answer (a TLS
    alert is at most 7 bytes)."""
    received = b""
    try:
        while chunk := s.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    return len(received) <= 7


def test_a_request_before_authentication_closes_the_connection(secure: Secure) -> None:
    with raw(secure.at("SASL_PLAINTEXT")) as s:
        versions = call(s, 18, 3, client_software_name="raw", client_software_version="1")
        assert versions.error_code == ErrorCode.none
        s.sendall(encode_request(make(request_class(3, 12), topics=None, allow_auto_topic_creation=False,
                                      include_topic_authorized_operations=False), correlation_id=2, client_id="raw"))
        assert closed(s)


def test_an_unknown_mechanism_is_answered_with_the_enabled_ones_then_closed(secure: Secure) -> None:
    with raw(secure.at("SASL_PLAINTEXT")) as s:
        answer = call(s, 17, 1, mechanism="GSSAPI")
        assert answer.error_code == ErrorCode.unsupported_sasl_mechanism
        assert set(answer.mechanisms) == {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}
        assert closed(s)


def test_sasl_handshake_v0_takes_bare_tokens_as_older_clients_send_them(secure: Secure) -> None:
    with raw(secure.at("SASL_PLAINTEXT")) as s:
        assert call(s, 17, 0, mechanism="PLAIN").error_code == ErrorCode.none
        token = f"\0{USER}\0{PASSWORD}".encode()
        s.sendall(struct.pack(">i", len(token)) + token)
        assert s.recv(4) == b"\x00\x00\x00\x00"  # an empty token: authenticated
        answer = call(s, 3, 1, correlation_id=3, topics=())
        assert [b.port for b in answer.brokers] == [int(secure.at("SASL_PLAINTEXT").split(":")[1])]
    with raw(secure.at("SASL_PLAINTEXT")) as s:  # a wrong password under v0: no answer, the connection closes
        assert call(s, 17, 0, mechanism="PLAIN").error_code == ErrorCode.none
        token = f"\0{USER}\0nope".encode()
        s.sendall(struct.pack(">i", len(token)) + token)
        assert closed(s)


def test_sasl_apis_on_a_listener_without_sasl_are_illegal_state(secure: Secure) -> None:
    with raw(secure.at("PLAINTEXT")) as s:
        assert call(s, 17, 1, mechanism="PLAIN").error_code == ErrorCode.illegal_sasl_state
        assert call(s, 36, 2, correlation_id=2, auth_bytes=b"x").error_code == ErrorCode.illegal_sasl_state


def test_a_sasl_exchange_cut_off_halfway_leaves_the_broker_serving(secure: Secure) -> None:
    for _ in range(20):
        with raw(secure.at("SASL_PLAINTEXT")) as s:
            assert call(s, 17, 1, mechanism="SCRAM-SHA-512").error_code == ErrorCode.none
            first = call(s, 36, 2, correlation_id=2, auth_bytes=b"n,,n=alice,r=abcdefgh")
            assert first.error_code == ErrorCode.none and first.auth_bytes.startswith(b"r=abcdefgh")
            s.sendall(b"\x00\x00\x01\x00" + b"x" * 10)  # half a frame, then gone
    assert confluent_round_trip(secure.at("SASL_PLAINTEXT"),
                                confluent_sasl("SASL_PLAINTEXT", "SCRAM-SHA-256", secure.pki)) == expected()


# ------------------------------------------------------------------------------------ reload


def test_a_replaced_certificate_is_served_to_new_connections_without_a_restart(secure: Secure, pki: Pki,
                                                                               tmp_path: Path) -> None:
    new_ca = trustme.CA()
    new = new_ca.issue_cert("127.0.0.1")
    new_ca.cert_pem.write_to_path(str(tmp_path / "new-ca.pem"))
    old_cert, old_key = pki.cert_file.read_bytes(), pki.key_file.read_bytes()
    host, port = secure.at("SSL").split(":")

    def served_by_new() -> bool:
        context = ssl.create_default_context(cafile=str(tmp_path / "new-ca.pem"))
        try:
            with socket.create_connection((host, int(port)), timeout=5) as s:
                context.wrap_socket(s, server_hostname=host).close()
                return True
        except ssl.SSLError:
            return False

    assert not served_by_new()
    try:
        new.private_key_pem.write_to_path(str(pki.key_file))
        new.cert_chain_pems[0].write_to_path(str(pki.cert_file))
        wait_for(served_by_new)
    finally:
        pki.cert_file.write_bytes(old_cert)
        pki.key_file.write_bytes(old_key)
    wait_for(lambda: not served_by_new())


# ------------------------------------------------------------------------------------ sessions and abuse


@pytest.fixture(scope="module")
def reauth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    """A SASL_PLAINTEXT broker whose sessions last 1.5 s (connections.max.reauth.ms)."""
    d = tmp_path_factory.mktemp("reauth-broker")
    config = BrokerConfig(listeners="SASL_PLAINTEXT://127.0.0.1:0", connections_max_reauth_ms=1500,
                          metrics_listen="", flush_interval_ms=20)
    broker = InProcessBroker(config, meta=lambda: EmbeddedStore(d / "meta.db"),
                             objects=lambda: LocalDirStore(d / "objects"))
    with broker:
        for mechanism in Mechanism:
            broker.run(credentials.upsert(broker.shard.core.meta, USER,  # type: ignore[union-attr]
                                          ScramCredential.from_password(mechanism, PASSWORD)))
        wait_for(lambda: broker.shard.core.credentials.any_of(USER) is not None)  # type: ignore[union-attr]
        yield broker


def test_librdkafka_reauthenticates_on_its_connection_before_the_session_ends(
        reauth: InProcessBroker, caplog: pytest.LogCaptureFixture, pki: Pki) -> None:
    caplog.set_level("INFO", logger="kafscale.acceptor.handlers.sasl_authenticate")
    bootstrap = reauth.bootstrap_for("SASL_PLAINTEXT")
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         **confluent_sasl("SASL_PLAINTEXT", "SCRAM-SHA-512", pki)})

    def logins() -> dict[str, int]:
        by_connection: dict[str, int] = {}
        for record in list(caplog.records):
            if "authenticated as User:alice" in record.getMessage():
                port = record.getMessage().split(":")[1]
                by_connection[port] = by_connection.get(port, 0) + 1
        return by_connection

    name, delivered, sent = topic(), [], 0
    deadline = time.monotonic() + 60  # three session lifetimes (4.5 s) and more, however slowly the client starts
    while max(logins().values(), default=0) < 3 and time.monotonic() < deadline:
        producer.produce(name, value=f"v{sent}".encode(), on_delivery=lambda err, m: delivered.append(err))
        sent += 1
        time.sleep(0.1)
        producer.poll(0)
    assert producer.flush(30) == 0 and delivered == [None] * sent
    assert max(logins().values(), default=0) >= 3, logins()  # the same connection, authenticated again and again


def test_a_client_that_does_not_reauthenticate_is_closed_at_its_next_request(reauth: InProcessBroker) -> None:
    with raw(reauth.bootstrap_for("SASL_PLAINTEXT")) as s:
        assert call(s, 17, 1, mechanism="PLAIN").error_code == ErrorCode.none
        answer = call(s, 36, 2, correlation_id=2, auth_bytes=f"\0{USER}\0{PASSWORD}".encode())
        assert answer.error_code == ErrorCode.none and answer.session_lifetime.total_seconds() == 1.5
        assert call(s, 3, 1, correlation_id=3, topics=()).brokers  # within the session
        time.sleep(1.6)
        s.sendall(encode_request(make(request_class(3, 1), topics=()), correlation_id=4, client_id="raw"))
        assert closed(s)


ATTEMPTS = 10_000
AT_ONCE = 2_000
RIGHT_LOGINS = 10


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, api_key: int, version: int,
                   correlation_id: int, **fields: Any) -> Any:
    writer.write(encode_request(make(request_class(api_key, version), **fields), correlation_id=correlation_id,
                                client_id="raw"))
    size = int.from_bytes(await reader.readexactly(4), "big")
    return decode_response(api_key, version, await reader.readexactly(size))[1]


async def wrong_scram(port: int, attempts: int, at_once: int) -> list[float]:
    """SCRAM-SHA-512 logins with a wrong proof, `at_once` connections at a time; each one's wait for its
    failure answer (the throttle's delay, mostly)."""
    waits: list[float] = []
    gate = asyncio.Semaphore(at_once)

    async def one(i: int) -> None:
        async with gate:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                assert (await exchange(reader, writer, 17, 1, 1, mechanism="SCRAM-SHA-512")).error_code == 0
                first = await exchange(reader, writer, 36, 2, 2, auth_bytes=f"n,,n={USER},r=guess{i}".encode())
                nonce = first.auth_bytes.decode().split(",")[0]
                final = f"c=biws,{nonce},p={base64.b64encode(bytes(64)).decode()}".encode()
                sent = time.monotonic()
                answer = await exchange(reader, writer, 36, 2, 3, auth_bytes=final)
                waits.append(time.monotonic() - sent)
                assert answer.error_code == ErrorCode.sasl_authentication_failed
                assert await reader.read() == b""  # then closed
            finally:
                writer.close()

    await asyncio.gather(*(one(i) for i in range(attempts)))
    return waits


async def right_scram_beside_a_control(sasl_port: int, plain_port: int, logins: int) -> list[float]:
    """SCRAM-SHA-256 logins of USER with the right password, one after another, from the guessers' address.
    The final step of each goes out together with an ApiVersions request on a PLAINTEXT connection, which no
    throttle touches. Returns, per login, how much longer its answer took than that request's: whatever load
    the machine is under slows both alike, a wait imposed on the login shows in the difference alone."""
    mechanism = Mechanism.SCRAM_SHA_256

    async def timed(call: Coroutine[Any, Any, Any]) -> tuple[Any, float]:
        sent = time.monotonic()
        return await call, time.monotonic() - sent

    extra: list[float] = []
    control_reader, control_writer = await asyncio.open_connection("127.0.0.1", plain_port)
    try:
        for i in range(logins):
            reader, writer = await asyncio.open_connection("127.0.0.1", sasl_port)
            try:
                assert (await exchange(reader, writer, 17, 1, 1, mechanism=mechanism.sasl_name)).error_code == 0
                first_bare = f"n={USER},r=right{i}"
                first = await exchange(reader, writer, 36, 2, 2, auth_bytes=f"n,,{first_bare}".encode())
                assert first.error_code == ErrorCode.none, first
                server_first = first.auth_bytes.decode()
                attrs = dict(kv.split("=", 1) for kv in server_first.split(","))
                salted = mechanism.salted_password(PASSWORD, base64.b64decode(attrs["s"]), int(attrs["i"]))
                client_key = mechanism.hmac(salted, b"Client Key")
                without_proof = f"c=biws,r={attrs['r']}"
                signature = mechanism.hmac(mechanism.hash(client_key),
                                           f"{first_bare},{server_first},{without_proof}".encode())
                proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature, strict=True))).decode()
                (final, login_s), (_, control_s) = await asyncio.gather(
                    timed(exchange(reader, writer, 36, 2, 3, auth_bytes=f"{without_proof},p={proof}".encode())),
                    timed(exchange(control_reader, control_writer, 18, 0, i)))
                assert final.error_code == ErrorCode.none, final
                extra.append(login_s - control_s)
            finally:
                writer.close()
    finally:
        control_writer.close()
    return extra


def test_ten_thousand_wrong_passwords_are_slowed_down_and_nobody_else_notices(
        secure: Secure, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    port = int(secure.at("SASL_PLAINTEXT").split(":")[1])
    result: dict[str, list[float]] = {}

    def guess() -> None:
        result["waits"] = asyncio.run(wrong_scram(port, ATTEMPTS, AT_ONCE))

    guesser = threading.Thread(target=guess)
    guesser.start()
    # Alice comes once the guessers' address is answered at the throttle's cap (a fixed sleep said nothing on a
    # busy machine, where the first guess failed 8 s in): a wait put on her too would now be that long.
    capped = f"answering in {MAX_DELAY_S:.1f} s"
    wait_for(lambda: not guesser.is_alive() or any(capped in r.getMessage() for r in caplog.records), timeout=180)
    extra = sorted(asyncio.run(right_scram_beside_a_control(
        port, int(secure.at("PLAINTEXT").split(":")[1]), RIGHT_LOGINS)))
    # And a real client with the right password meanwhile, given the time a loaded machine needs.
    assert confluent_round_trip(secure.at("SASL_PLAINTEXT"),
                                confluent_sasl("SASL_PLAINTEXT", "SCRAM-SHA-256", secure.pki),
                                deadline_s=120) == expected()
    guesser.join(300)
    waits = sorted(result["waits"])
    assert len(waits) == ATTEMPTS
    assert waits[len(waits) // 2] >= 1.0  # answered ever more slowly: most waited about the 2 s cap
    # Nobody else notices: her logins were answered about as fast as a request sent beside them. The guessers'
    # answers wait the cap; hers, were they held too, would be MAX_DELAY_S behind, twice this bound.
    assert extra[len(extra) // 2] < MAX_DELAY_S / 2, f"alice's logins took {extra} s longer than a request beside them"
    # A wrong PLAIN password is never written to the log.
    marker = f"guess-{uuid.uuid4().hex}"
    admin = AdminClient({"bootstrap.servers": secure.at("SASL_PLAINTEXT"),
                         **confluent_sasl("SASL_PLAINTEXT", "PLAIN", secure.pki, password=marker)})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=3)
    assert marker not in caplog.text and "failed" in caplog.text


# ------------------------------------------------------------------------------------ kafscale user


def user_cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *argv: str,
             password: str = "") -> tuple[int, str, str]:
    from kafscale.cli import main

    monkeypatch.setattr("sys.stdin", io.StringIO(password + "\n"))
    code = main(["user", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_kafscale_user_makes_the_first_user_in_the_store_then_manages_users_through_the_kafka_api(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, pki: Pki) -> None:
    data = str(tmp_path)
    code, _, err = user_cli(capsys, monkeypatch, "create", "carol", "--password-stdin", "--data-dir", data,
                            password="carol-pw")
    assert code == 0 and "SCRAM-SHA-256, SCRAM-SHA-512 set" in err
    code, out, _ = user_cli(capsys, monkeypatch, "list", "--data-dir", data, "-o", "json")
    assert json.loads(out) == [{"user": "carol", "mechanisms": [{"mechanism": "SCRAM-SHA-256", "iterations": 8192},
                                                                {"mechanism": "SCRAM-SHA-512", "iterations": 8192}]}]
    config = BrokerConfig(listeners="SASL_PLAINTEXT://127.0.0.1:0", metrics_listen="", flush_interval_ms=20)
    with InProcessBroker(config, meta=lambda: EmbeddedStore(tmp_path / "metadata.db"),
                         objects=lambda: LocalDirStore(tmp_path / "objects")) as broker:
        bootstrap = broker.bootstrap_for("SASL_PLAINTEXT")
        carol = confluent_sasl("SASL_PLAINTEXT", "SCRAM-SHA-512", pki, user="carol", password="carol-pw")
        assert confluent_round_trip(bootstrap, carol, n=3) == expected(3)

        code, _, err = user_cli(capsys, monkeypatch, "create", "dave", "--password-stdin", "--data-dir", data,
                                password="dave-pw")
        assert code == 1 and "a broker is running on it" in err and "-b HOST:PORT" in err

        as_carol = ["-b", bootstrap, *[f"-X{k}={v}" for k, v in carol.items()]]
        code, _, err = user_cli(capsys, monkeypatch, "create", "dave", "--password-stdin",
                                "--mechanism", "SCRAM-SHA-256", *as_carol, password="dave-pw")
        assert code == 0, err
        code, out, _ = user_cli(capsys, monkeypatch, "list", *as_carol)
        assert "carol  SCRAM-SHA-256 (8192), SCRAM-SHA-512 (8192)" in out and "dave   SCRAM-SHA-256 (8192)" in out
        dave = confluent_sasl("SASL_PLAINTEXT", "SCRAM-SHA-256", pki, user="dave", password="dave-pw")
        wait_for(lambda: broker.shard.core.credentials.any_of("dave") is not None)  # type: ignore[union-attr]
        assert confluent_round_trip(bootstrap, dave, n=3) == expected(3)

        code, _, err = user_cli(capsys, monkeypatch, "delete", "dave", *as_carol)
        assert code == 0 and "SCRAM-SHA-256 removed" in err
        wait_for(lambda: broker.shard.core.credentials.any_of("dave") is None)  # type: ignore[union-attr]
        admin = AdminClient({"bootstrap.servers": bootstrap, **dave})
        with pytest.raises(KafkaException):
            admin.list_topics(timeout=3)
        code, _, err = user_cli(capsys, monkeypatch, "delete", "nobody", *as_carol)
        assert code == 1 and "nobody" in err


# ------------------------------------------------------------------------------------ kafscale serve


@pytest.mark.timeout(START_TIMEOUT_S + 300)  # a start of `kafscale serve` may take its whole wait on a busy machine
def test_every_shard_of_kafscale_serve_serves_every_listener(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, pki: Pki) -> None:
    """Two shards on Ray, PLAINTEXT and SASL_PLAINTEXT: each shard binds both (PORT+k), Metadata over each
    listener names both shards at that listener's ports, and a SASL client reaches both shards' partitions
    (each shard checks the user against its own mirror of the credentials)."""
    from confluent_kafka.admin import NewTopic

    from kafscale.testing.ports import free_ports_in_a_row

    data = tmp_path / "data"
    code, _, err = user_cli(capsys, monkeypatch, "create", USER, "--password-stdin", "--data-dir", str(data),
                            password=PASSWORD)
    assert code == 0, err
    plain, sasl = free_ports_in_a_row(2), free_ports_in_a_row(2)
    with ServeProcess(data, shards=2, listeners={"PLAINTEXT": plain, "SASL_PLAINTEXT": sasl}) as serve:
        settings = confluent_sasl("SASL_PLAINTEXT", "SCRAM-SHA-512", pki)
        for bootstrap, extra, first in ((f"127.0.0.1:{plain}", {}, plain), (f"127.0.0.1:{sasl + 1}", settings, sasl)):
            admin = AdminClient({"bootstrap.servers": bootstrap, **extra})
            brokers = admin.list_topics(timeout=30).brokers
            assert sorted((b.id, b.port) for b in brokers.values()) == [(0, first), (1, first + 1)], serve.log_text()
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{sasl}", **settings})
        name = topic()
        admin.create_topics([NewTopic(name, 4)])[name].result(30)
        leaders = {p.leader for p in admin.list_topics(name, timeout=30).topics[name].partitions.values()}
        assert leaders == {0, 1}
        producer = Producer({"bootstrap.servers": f"127.0.0.1:{sasl}", "acks": "all", **settings})
        for i in range(40):
            producer.produce(name, value=f"v{i}".encode(), partition=i % 4)
        assert producer.flush(30) == 0
        consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{sasl}", "group.id": f"g-{name}",
                             "auto.offset.reset": "earliest", **settings})
        try:
            consumer.subscribe([name])
            got: list[bytes] = []
            deadline = time.monotonic() + 60
            while len(got) < 40 and time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is not None and message.error() is None:
                    got.append(message.value())
        finally:
            consumer.close()
        assert sorted(got) == sorted(f"v{i}".encode() for i in range(40))


# ------------------------------------------------------------------------------------ the metrics endpoint


def _https(url: str, cafile: Path, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10, context=ssl.create_default_context(cafile=str(cafile))) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_the_metrics_endpoint_serves_https_and_asks_for_the_bearer_token(pki: Pki, tmp_path: Path) -> None:
    token_file = tmp_path / "metrics-token"
    token_file.write_text("first-token\n")
    config = BrokerConfig(ssl_certfile=str(pki.cert_file), ssl_keyfile=str(pki.key_file), metrics_tls=True,
                          metrics_token_file=str(token_file), metrics_listen="127.0.0.1:0")
    with InProcessBroker(config, meta=lambda: EmbeddedStore(tmp_path / "meta.db"),
                         objects=lambda: LocalDirStore(tmp_path / "objects")) as broker:
        server = broker.shard.metrics_server  # type: ignore[union-attr]
        assert server is not None
        base = f"https://127.0.0.1:{server.port}"
        status, body = _https(f"{base}/metrics", pki.ca_file, "first-token")
        assert status == 200 and "kafscale_" in body
        assert _https(f"{base}/readyz", pki.ca_file, "first-token")[0] == 200
        for path in ("/metrics", "/readyz"):
            assert _https(f"{base}{path}", pki.ca_file)[0] == 401, f"{path} answered without a token"
            assert _https(f"{base}{path}", pki.ca_file, "wrong-token")[0] == 401, f"{path} took a wrong token"
        assert _https(f"{base}/healthz", pki.ca_file)[0] == 200, "liveness probes need no token"
        with pytest.raises(OSError):  # plain HTTP on the HTTPS port gets no answer
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=5).read()

        token_file.write_text("second-token\n")  # rotated by rewriting the file, no restart
        wait_for(lambda: _https(f"{base}/metrics", pki.ca_file, "second-token")[0] == 200)
        assert _https(f"{base}/metrics", pki.ca_file, "first-token")[0] == 401


def test_metrics_tls_without_a_certificate_is_refused_with_the_setting_named() -> None:
    with pytest.raises(ConfigError, match="metrics_tls"):
        BrokerConfig(metrics_tls=True).validate()
    with pytest.raises(ConfigError, match="metrics_token_file"):
        BrokerConfig(metrics_token_file="/nonexistent/token").validate()
