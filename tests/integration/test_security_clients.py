"""Every client over every secure way in: confluent-kafka, kafka-python, aiokafka, kcat and kafkajs each produce
20 records and read them back through a consumer group over SSL, mTLS, SASL_SSL with SCRAM-SHA-512 and with
PLAIN, and SASL_PLAINTEXT with SCRAM-SHA-256 (docs/security.md).

Two brokers: one whose SSL listener asks for no client certificate, one whose SSL listener requires one (so a
round trip there proves the client presented its certificate) and whose SASL_SSL and SASL_PLAINTEXT listeners
take SASL logins; as in Kafka, --ssl-client-auth does not apply to SASL_SSL.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from kafscale.config import BrokerConfig
from kafscale.security import credentials
from kafscale.security.scram import Mechanism, ScramCredential
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.local_store import LocalDirStore
from kafscale.testing.inprocess import InProcessBroker
from tests.integration.pki import ALICE_RULE, PASSWORD, USER, Pki, make_pki
from tests.integration.test_security import confluent_round_trip, expected, topic, wait_for

pytestmark = pytest.mark.timeout(120)
KCAT = "/usr/bin/kcat"
KAFKAJS = Path(__file__).resolve().parents[1] / "clients" / "kafkajs"
N = 20


@dataclass(frozen=True)
class Mode:
    listener: str  # SSL, SASL_SSL or SASL_PLAINTEXT
    mechanism: str = ""  # SASL mechanism
    client_cert: bool = False  # mTLS: only the broker that requires client certificates


MODES = {"SSL": Mode("SSL"), "mTLS": Mode("SSL", client_cert=True),
         "SASL_SSL-SCRAM-SHA-512": Mode("SASL_SSL", "SCRAM-SHA-512"), "SASL_SSL-PLAIN": Mode("SASL_SSL", "PLAIN"),
         "SASL_PLAINTEXT-SCRAM-SHA-256": Mode("SASL_PLAINTEXT", "SCRAM-SHA-256")}


@dataclass
class Brokers:
    open_ssl: InProcessBroker  # SSL without client certificates
    mtls: InProcessBroker  # SSL with client certificates required, SASL_SSL, SASL_PLAINTEXT
    pki: Pki

    def bootstrap(self, mode: Mode) -> str:
        broker = self.open_ssl if mode.listener == "SSL" and not mode.client_cert else self.mtls
        return broker.bootstrap_for(mode.listener)


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokers]:
    d = tmp_path_factory.mktemp("secure-clients")
    pki = make_pki(d)
    tls = {"ssl_certfile": str(pki.cert_file), "ssl_keyfile": str(pki.key_file), "ssl_cafile": str(pki.ca_file),
           "ssl_principal_mapping_rules": ALICE_RULE, "metrics_listen": "", "flush_interval_ms": 20}
    open_ssl = InProcessBroker(BrokerConfig(listeners="SSL://127.0.0.1:0", **tls),  # type: ignore[arg-type]
                               meta=lambda: EmbeddedStore(d / "open.db"), objects=lambda: LocalDirStore(d / "open"))
    mtls = InProcessBroker(BrokerConfig(listeners="SSL://127.0.0.1:0,SASL_SSL://127.0.0.1:0,"  # type: ignore[arg-type]
                                        "SASL_PLAINTEXT://127.0.0.1:0", ssl_client_auth="required", **tls),
                           meta=lambda: EmbeddedStore(d / "mtls.db"), objects=lambda: LocalDirStore(d / "mtls"))
    with open_ssl, mtls:
        for mechanism in Mechanism:
            mtls.run(credentials.upsert(mtls.shard.core.meta, USER,  # type: ignore[union-attr]
                                        ScramCredential.from_password(mechanism, PASSWORD)))
        wait_for(lambda: mtls.shard.core.credentials.any_of(USER) is not None)  # type: ignore[union-attr]
        yield Brokers(open_ssl, mtls, pki)


# ------------------------------------------------------------------------------------ one round trip per client


def confluent(bootstrap: str, mode: Mode, pki: Pki) -> list[bytes]:
    settings: dict[str, Any] = {"security.protocol": mode.listener}
    if "SSL" in mode.listener:
        settings["ssl.ca.location"] = str(pki.ca_file)
    if mode.client_cert:
        settings |= {"ssl.certificate.location": str(pki.client_cert), "ssl.key.location": str(pki.client_key)}
    if mode.mechanism:
        settings |= {"sasl.mechanisms": mode.mechanism, "sasl.username": USER, "sasl.password": PASSWORD}
    return confluent_round_trip(bootstrap, settings, N)


def kafka_python(bootstrap: str, mode: Mode, pki: Pki) -> list[bytes]:
    from kafka import KafkaConsumer, KafkaProducer

    settings: dict[str, Any] = {"bootstrap_servers": bootstrap, "security_protocol": mode.listener}
    if "SSL" in mode.listener:
        settings["ssl_cafile"] = str(pki.ca_file)
    if mode.client_cert:
        settings |= {"ssl_certfile": str(pki.client_cert), "ssl_keyfile": str(pki.client_key)}
    if mode.mechanism:
        settings |= {"sasl_mechanism": mode.mechanism, "sasl_plain_username": USER, "sasl_plain_password": PASSWORD}
    name = topic()
    producer = KafkaProducer(acks="all", **settings)
    for i in range(N):
        producer.send(name, f"v{i}".encode())
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer(name, group_id=f"g-{name}", auto_offset_reset="earliest", **settings)
    consumer.partitions_for_topic(name)  # kafka-python 3.0.12's join without metadata (docs/groups.md, Client notes)
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while len(got) < N and time.monotonic() < deadline:
            got += [m.value for batch in consumer.poll(timeout_ms=500).values() for m in batch]
    finally:
        consumer.close()
    return got


def aiokafka(bootstrap: str, mode: Mode, pki: Pki) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.helpers import create_ssl_context

    settings: dict[str, Any] = {"bootstrap_servers": bootstrap, "security_protocol": mode.listener}
    if "SSL" in mode.listener:
        settings["ssl_context"] = create_ssl_context(
            cafile=str(pki.ca_file), certfile=str(pki.client_cert) if mode.client_cert else None,
            keyfile=str(pki.client_key) if mode.client_cert else None)
    if mode.mechanism:
        settings |= {"sasl_mechanism": mode.mechanism, "sasl_plain_username": USER, "sasl_plain_password": PASSWORD}

    async def run() -> list[bytes]:
        name = topic()
        producer = AIOKafkaProducer(acks="all", **settings)
        await producer.start()
        try:
            for i in range(N):
                await producer.send_and_wait(name, f"v{i}".encode())
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(name, group_id=f"g-{name}", auto_offset_reset="earliest", **settings)
        await consumer.start()
        got: list[bytes] = []
        try:
            while len(got) < N:
                batch = await asyncio.wait_for(consumer.getmany(timeout_ms=1000), 30)
                got += [m.value for messages in batch.values() for m in messages]
        finally:
            await consumer.stop()
        return got

    return asyncio.run(run())


def kcat(bootstrap: str, mode: Mode, pki: Pki) -> list[bytes]:
    settings = ["-X", f"security.protocol={mode.listener}"]
    if "SSL" in mode.listener:
        settings += ["-X", f"ssl.ca.location={pki.ca_file}"]
    if mode.client_cert:
        settings += ["-X", f"ssl.certificate.location={pki.client_cert}", "-X", f"ssl.key.location={pki.client_key}"]
    if mode.mechanism:
        settings += ["-X", f"sasl.mechanisms={mode.mechanism}", "-X", f"sasl.username={USER}",
                     "-X", f"sasl.password={PASSWORD}"]
    name = topic()
    lines = "".join(f"v{i}\n" for i in range(N))
    subprocess.run([KCAT, "-b", bootstrap, *settings, "-P", "-t", name], input=lines.encode(), check=True,
                   timeout=60)
    out = subprocess.run([KCAT, "-b", bootstrap, *settings, "-G", f"g-{name}", "-o", "beginning", "-e", "-c",
                          str(N), name], capture_output=True, check=True, timeout=60).stdout
    return out.split()


def kafkajs(bootstrap: str, mode: Mode, pki: Pki) -> list[bytes]:
    spec: dict[str, Any] = {"brokers": [bootstrap], "topic": topic(), "n": N}
    if "SSL" in mode.listener:
        spec["ssl"] = {"ca": str(pki.ca_file)}
        if mode.client_cert:
            spec["ssl"] |= {"cert": str(pki.client_cert), "key": str(pki.client_key)}
    if mode.mechanism:
        spec["sasl"] = {"mechanism": mode.mechanism.lower(), "username": USER, "password": PASSWORD}
    done = subprocess.run(["node", str(KAFKAJS / "roundtrip.js"), json.dumps(spec)], capture_output=True,
                          timeout=90, cwd=KAFKAJS)
    assert done.returncode == 0, done.stderr.decode()
    return [v.encode() for v in json.loads(done.stdout)]


CLIENTS: dict[str, Callable[[str, Mode, Pki], list[bytes]]] = {
    "confluent-kafka": confluent, "kafka-python": kafka_python, "aiokafka": aiokafka, "kcat": kcat,
    "kafkajs": kafkajs}


def _usable(client: str) -> None:
    """kcat and kafkajs come from make test's installs; without them the test fails, naming the step."""
    if client == "kcat":
        assert shutil.which(KCAT), "kcat is missing: make test installs it (scripts/install-system-deps.sh)"
    if client == "kafkajs":
        assert (KAFKAJS / "node_modules" / "kafkajs").is_dir(), \
            "kafkajs is missing: make test installs it (npm ci in tests/clients/kafkajs)"


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("client", list(CLIENTS))
def test_client_produces_and_consumes(brokers: Brokers, client: str, mode: str) -> None:
    _usable(client)
    got = CLIENTS[client](brokers.bootstrap(MODES[mode]), MODES[mode], brokers.pki)
    assert sorted(got) == sorted(expected(N)), f"{client} over {mode} read {len(got)} of {N}"


def test_without_a_client_certificate_the_mtls_listener_refuses_and_sasl_ssl_does_not_ask(brokers: Brokers) -> None:
    ssl_only = {"security.protocol": "SSL", "ssl.ca.location": str(brokers.pki.ca_file)}
    with pytest.raises(KafkaException):
        AdminClient({"bootstrap.servers": brokers.mtls.bootstrap_for("SSL"), **ssl_only}).list_topics(timeout=5)
    sasl_ssl = {**ssl_only, "security.protocol": "SASL_SSL", "sasl.mechanisms": "PLAIN", "sasl.username": USER,
                "sasl.password": PASSWORD}
    assert AdminClient({"bootstrap.servers": brokers.mtls.bootstrap_for("SASL_SSL"), **sasl_ssl}).list_topics(
        timeout=15).brokers
