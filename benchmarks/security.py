"""The `security` scenario (issue 22): 1 KiB acks=all produce and a catch-up read over SASL_SSL (SCRAM-SHA-512)
beside PLAINTEXT, on one `kafscale serve` (one shard, embedded stores) with both listeners, in the same run. The
target: SASL_SSL at least 70% of PLAINTEXT's throughput.

Beside it, a second `kafscale serve` with `--authorizer acl` and 1,000 prefixed ACLs of other principals beside
the benchmark user's own, over SASL_SSL: the cost of the ACL check on the data path, against SASL_SSL without the
authorizer in the same run. The phases alternate between the two, ROUNDS times.

The clients are confluent-kafka in this process (librdkafka does the TLS and the I/O on its own threads). Each
phase runs for PHASE_S seconds on a topic of its own; the catch-up read consumes what that phase produced.
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.common import Context, MiB, Reference, Result, log
from kafscale.testing.ports import free_ports_in_a_row
from kafscale.testing.serve_process import ServeProcess

RECORD = 1024
PHASE_S = 8.0
TARGET_RATIO = 0.7
USER, ADMIN, PASSWORD = "bench", "bench-admin", "bench-secret"
OTHER_ACLS = 1000
ROUNDS = 2  # each phase this often, alternating, reported as the median (runs here vary by 20%)


def security(ctx: Context) -> None:
    import trustme

    d = ctx.work / "security"
    d.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    server.private_key_and_cert_chain_pem.write_to_path(str(d / "server.pem"))
    plain, sasl_ssl, acl_port = free_ports_in_a_row(1), free_ports_in_a_row(1), free_ports_in_a_row(1)
    sasl = {"security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": USER,
            "sasl.password": PASSWORD, "ssl.ca.location": str(d / "ca.pem")}
    _add_user(d / "data", USER, PASSWORD)
    for user in (USER, ADMIN):
        _add_user(d / "acl-data", user, PASSWORD)
    serve = ServeProcess(d / "data", shards=1, listeners={"PLAINTEXT": plain, "SASL_SSL": sasl_ssl},
                         extra_args=["--ssl-certfile", str(d / "server.pem")], log_path=d / "serve.log")
    with_acls = ServeProcess(d / "acl-data", shards=1, listeners={"SASL_SSL": acl_port},
                             extra_args=["--ssl-certfile", str(d / "server.pem"), "--authorizer", "acl",
                                         "--super-users", f"User:{ADMIN}"], log_path=d / "serve-acl.log")
    phases = {"PLAINTEXT": {"bootstrap.servers": f"127.0.0.1:{plain}"},
              "SASL_SSL": {"bootstrap.servers": f"127.0.0.1:{sasl_ssl}", **sasl},
              "SASL_SSL_ACL": {"bootstrap.servers": f"127.0.0.1:{acl_port}", **sasl}}
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in phases}
    with serve, with_acls:  # both up throughout; the idle one costs little, and the phases alternate between them
        _grant(phases["SASL_SSL_ACL"] | {"sasl.username": ADMIN})
        for _ in range(ROUNDS):
            for name, conf in phases.items():
                rounds[name].append(_phase(name, conf))
    figures = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for name, runs in rounds.items()}

    for phase in ("produce", "read"):
        base = figures["PLAINTEXT"][phase]
        ctx.add(Result("security", f"{phase}_plaintext_mib_s", round(base, 3), "MiB/s", "local", [],
                       {"record_bytes": RECORD, "phase_s": PHASE_S, "rounds": ROUNDS}, figures["PLAINTEXT"]))
        ctx.add(Result("security", f"{phase}_sasl_ssl_mib_s", round(figures["SASL_SSL"][phase], 3), "MiB/s", "local",
                       [Reference("target", round(TARGET_RATIO * base, 3), "MiB/s", "higher",
                                  f"{TARGET_RATIO:.0%} of PLAINTEXT in the same run")],
                       {"record_bytes": RECORD, "phase_s": PHASE_S, "rounds": ROUNDS, "mechanism": "SCRAM-SHA-512"},
                       figures["SASL_SSL"]))
        ctx.add(Result("security", f"{phase}_sasl_ssl_acl_mib_s", round(figures["SASL_SSL_ACL"][phase], 3), "MiB/s",
                       "local", [Reference("sasl_ssl", round(figures["SASL_SSL"][phase], 3), "MiB/s", "higher",
                                           "SASL_SSL without the authorizer, same run")],
                       {"record_bytes": RECORD, "phase_s": PHASE_S, "rounds": ROUNDS, "acls": OTHER_ACLS + 3},
                       figures["SASL_SSL_ACL"]))


def _add_user(data: Path, user: str, password: str) -> None:
    from kafscale.cli import main as cli

    data.mkdir(parents=True, exist_ok=True)
    secret = data.parent / f"{data.name}-{user}.password"
    secret.write_text(password + "\n")
    with secret.open() as stdin:
        old, sys.stdin = sys.stdin, stdin
        try:
            assert cli(["user", "create", user, "--password-stdin", "--mechanism", "SCRAM-SHA-512",
                        "--data-dir", str(data)]) == 0
        finally:
            sys.stdin = old


def _grant(admin_conf: dict[str, Any]) -> None:
    """The benchmark user's ACLs (its topics, its groups), after OTHER_ACLS prefixed ones of other principals."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    allow, prefixed = AclPermissionType.ALLOW, ResourcePatternType.PREFIXED
    bindings = [AclBinding(ResourceType.TOPIC, f"other-{i}-", prefixed, f"User:app-{i}", "*", AclOperation.WRITE,
                           allow) for i in range(OTHER_ACLS)]
    bindings += [AclBinding(ResourceType.TOPIC, "sec-", prefixed, f"User:{USER}", "*", AclOperation.ALL, allow),
                 AclBinding(ResourceType.GROUP, "bench-", prefixed, f"User:{USER}", "*", AclOperation.READ, allow),
                 AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, f"User:{USER}", "*",
                            AclOperation.IDEMPOTENT_WRITE, allow)]
    admin = AdminClient(admin_conf)  # kept until the answers are in: its futures die with it
    for future in admin.create_acls(bindings, request_timeout=60).values():
        future.result()
    time.sleep(1.5)  # ACL changes reach the shard within a second


def _phase(name: str, conf: dict[str, Any]) -> dict[str, float]:
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"sec-{name.split()[0].lower()}-{uuid.uuid4().hex[:6]}"
    admin = AdminClient(conf)
    admin.create_topics([NewTopic(topic, 4)])[topic].result(30)
    produced, produce_s = _produce(conf, topic)
    read, read_s = _catch_up(conf, topic, produced)
    out = {"produce": produced * RECORD / MiB / produce_s, "read": read * RECORD / MiB / read_s, "records": produced}
    log(f"security: {name}: produce {out['produce']:.1f} MiB/s, catch-up read {out['read']:.1f} MiB/s "
        f"({produced} records)")
    return out


def _produce(conf: dict[str, Any], topic: str) -> tuple[int, float]:
    from confluent_kafka import Producer

    producer = Producer({**conf, "acks": "all", "linger.ms": 5, "enable.idempotence": True})
    value = b"x" * RECORD
    acked = [0]

    def done(err: Any, _msg: Any) -> None:
        if err is None:
            acked[0] += 1

    started = time.monotonic()
    while time.monotonic() - started < PHASE_S:
        try:
            producer.produce(topic, value, on_delivery=done)
        except BufferError:
            producer.poll(0.01)
        producer.poll(0)
    producer.flush(60)
    return acked[0], time.monotonic() - started


def _catch_up(conf: dict[str, Any], topic: str, expected: int) -> tuple[int, float]:
    from confluent_kafka import Consumer

    consumer = Consumer({**conf, "group.id": f"bench-{topic}", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "fetch.max.bytes": 64 * MiB})
    consumer.subscribe([topic])
    got, started, first = 0, time.monotonic(), None
    try:
        while got < expected and time.monotonic() - started < 120:
            for m in consumer.consume(10_000, 0.5):
                if m.error() is None:
                    first = first or time.monotonic()
                    got += 1
    finally:
        consumer.close()
    return got, time.monotonic() - (first or started)
