"""The broker the JVM tests talk to, and the Java client's settings for each way in.

One in-process broker for the session (embedded stores), with three listeners: PLAINTEXT, SSL requiring a client
certificate (mTLS; the tests' mapping rule makes CN=alice,OU=ServiceUsers,... User:alice) and SASL_SSL (SCRAM and
PLAIN against the stored credentials of alice). The ACL authorizer is on, with alice a super user and everyone
allowed where no ACL applies, so the ACL APIs answer (without an authorizer they say SECURITY_DISABLED) and the
anonymous PLAINTEXT clients may do what the tests do.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.serialization import pkcs12

from kafscale.config import BrokerConfig
from kafscale.security import credentials
from kafscale.security.scram import Mechanism, ScramCredential
from kafscale.storage.embedded_store import EmbeddedStore
from kafscale.storage.local_store import LocalDirStore
from kafscale.testing.inprocess import InProcessBroker
from tests.integration.conftest import KafkaWire
from tests.integration.pki import ALICE_RULE, PASSWORD, USER, Pki, make_pki
from tests.integration.test_security import wait_for

LISTENERS = "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_SSL://127.0.0.1:0"
KEYSTORE_PASSWORD = "keystore-secret"
# Consumer-protocol groups (KIP-848; test_consumer_protocol.py) get their session and heartbeat from the broker, not
# from the client: a killed member's partitions move after 6 s instead of 45 s, and members learn of a new
# assignment within half a second instead of five. Classic groups do not read these settings.
CONSUMER_GROUP_TIMINGS = {"group_consumer_session_timeout_ms": 6000, "group_consumer_min_session_timeout_ms": 6000,
                          "group_consumer_heartbeat_interval_ms": 500,
                          "group_consumer_min_heartbeat_interval_ms": 500}


@dataclass
class JvmBroker:
    broker: InProcessBroker
    pki: Pki
    keystore: Path  # the client's certificate and key, PKCS#12, password KEYSTORE_PASSWORD

    def at(self, listener: str) -> str:
        return self.broker.bootstrap_for(listener)

    @property
    def port(self) -> int:
        return int(self.at("PLAINTEXT").rsplit(":", 1)[1])

    @property
    def node_id(self) -> int:
        """The broker id Metadata gives (the shard's)."""
        with KafkaWire(self.port) as wire:
            return int(wire.metadata([]).brokers[0].node_id)

    # The Java client's settings (the same keys Kafka's tools take in a --command-config file).

    def plaintext(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.at("PLAINTEXT")}

    def scram(self, user: str = USER, password: str = PASSWORD, mechanism: str = "SCRAM-SHA-512") -> dict[str, Any]:
        return {"bootstrap.servers": self.at("SASL_SSL"), "security.protocol": "SASL_SSL",
                "sasl.mechanism": mechanism,
                "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
                                    f'username="{user}" password="{password}";',
                "ssl.truststore.type": "PEM", "ssl.truststore.location": str(self.pki.ca_file)}

    def mtls(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.at("SSL"), "security.protocol": "SSL",
                "ssl.truststore.type": "PEM", "ssl.truststore.location": str(self.pki.ca_file),
                "ssl.keystore.type": "PKCS12", "ssl.keystore.location": str(self.keystore),
                "ssl.keystore.password": KEYSTORE_PASSWORD, "ssl.key.password": KEYSTORE_PASSWORD}


def pkcs12_keystore(pki: Pki, path: Path) -> Path:
    """The client certificate and key as a PKCS#12 keystore. (A PEM keystore, ssl.keystore.type=PEM, needs an
    encrypted key before Kafka 3.x: "SSL PEM key store is specified, but key password is not specified".)"""
    key = serialization.load_pem_private_key(pki.client_key.read_bytes(), password=None)
    cert = x509.load_pem_x509_certificate(pki.client_cert.read_bytes())
    encryption = (serialization.PrivateFormat.PKCS12.encryption_builder()
                  .key_cert_algorithm(pkcs12.PBES.PBESv2SHA256AndAES256CBC).hmac_hash(hashes.SHA256())
                  .build(KEYSTORE_PASSWORD.encode()))
    path.write_bytes(pkcs12.serialize_key_and_certificates(b"client", key, cert, None,  # type: ignore[arg-type]
                                                           encryption))
    return path


@pytest.fixture(scope="session")
def jvm_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JvmBroker]:
    d = tmp_path_factory.mktemp("jvm-broker")
    pki = make_pki(d)
    config = BrokerConfig(listeners=LISTENERS, ssl_certfile=str(pki.cert_file), ssl_keyfile=str(pki.key_file),
                          ssl_cafile=str(pki.ca_file), ssl_client_auth="required",
                          ssl_principal_mapping_rules=ALICE_RULE, authorizer="acl", super_users=f"User:{USER}",
                          allow_everyone_if_no_acl_found=True, metrics_listen="", flush_interval_ms=20,
                          log_cleaner_backoff_ms=500, **CONSUMER_GROUP_TIMINGS)
    broker = InProcessBroker(config, meta=lambda: EmbeddedStore(d / "meta.db"),
                             objects=lambda: LocalDirStore(d / "objects"))
    with broker:
        for mechanism in Mechanism:  # the first user, made against the store as `kafscale user create` does
            broker.run(credentials.upsert(broker.shard.core.meta, USER,  # type: ignore[union-attr]
                                          ScramCredential.from_password(mechanism, PASSWORD)))
        wait_for(lambda: broker.shard.core.credentials.any_of(USER) is not None)  # type: ignore[union-attr]
        yield JvmBroker(broker, pki, pkcs12_keystore(pki, d / "client.p12"))
