"""Certificates for the security tests, made by a test CA (trustme): the broker's for 127.0.0.1 and a client's
whose subject, CN=alice,OU=ServiceUsers,O=Acme, the tests' mapping rule takes to User:alice."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme

USER, PASSWORD = "alice", "alice-secret"
# Kafka's ssl.principal.mapping.rules: CN=alice,OU=ServiceUsers,... is User:alice
ALICE_RULE = r"RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L,DEFAULT"


@dataclass
class Pki:
    ca: trustme.CA
    ca_file: Path
    cert_file: Path
    key_file: Path
    client_cert: Path
    client_key: Path


def make_pki(d: Path) -> Pki:
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("alice@example.com", common_name="alice", organization_name="Acme",
                           organization_unit_name="ServiceUsers")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    server.cert_chain_pems[0].write_to_path(str(d / "server.pem"))
    for pem in server.cert_chain_pems[1:]:
        pem.write_to_path(str(d / "server.pem"), append=True)
    server.private_key_pem.write_to_path(str(d / "server.key"))
    client.cert_chain_pems[0].write_to_path(str(d / "client.pem"))
    client.private_key_pem.write_to_path(str(d / "client.key"))
    return Pki(ca, d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key")
