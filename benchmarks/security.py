"""The `security` scenario (issue 22): 1 KiB acks=all produce and a catch-up read over SASL_SSL (SCRAM-SHA-512)
beside PLAINTEXT, on one `kafscale serve` (one shard, embedded stores) with both listeners, in the same run. The
target: SASL_SSL at least 70% of PLAINTEXT's throughput.

The clients are confluent-kafka in this process (librdkafka does the TLS and the I/O on its own threads). Each
phase runs for PHASE_S seconds on a topic of its own; the catch-up read consumes what that phase produced.
"""

from __future__ import annotations

import sys
import time
import uuid
from typing import Any

from benchmarks.common import Context, MiB, Reference, Result, log
from kafscale.testing.ports import free_ports_in_a_row
from kafscale.testing.serve_process import ServeProcess

RECORD = 1024
PHASE_S = 8.0
TARGET_RATIO = 0.7
USER, PASSWORD = "bench", "bench-secret"


def security(ctx: Context) -> None:
    import trustme
    from confluent_kafka.admin import AdminClient, NewTopic

    from kafscale.cli import main as cli

    d = ctx.work / "security"
    d.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    server.private_key_and_cert_chain_pem.write_to_path(str(d / "server.pem"))
    (d / "password").write_text(PASSWORD + "\n")
    with (d / "password").open() as stdin:
        old, sys.stdin = sys.stdin, stdin
        try:
            assert cli(["user", "create", USER, "--password-stdin", "--mechanism", "SCRAM-SHA-512",
                        "--data-dir", str(d / "data")]) == 0
        finally:
            sys.stdin = old
    plain, sasl_ssl = free_ports_in_a_row(1), free_ports_in_a_row(1)
    serve = ServeProcess(d / "data", shards=1, listeners={"PLAINTEXT": plain, "SASL_SSL": sasl_ssl},
                         extra_args=["--ssl-certfile", str(d / "server.pem")], log_path=d / "serve.log")
    settings: dict[str, dict[str, Any]] = {
        "PLAINTEXT": {"bootstrap.servers": f"127.0.0.1:{plain}"},
        "SASL_SSL": {"bootstrap.servers": f"127.0.0.1:{sasl_ssl}", "security.protocol": "SASL_SSL",
                     "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": USER, "sasl.password": PASSWORD,
                     "ssl.ca.location": str(d / "ca.pem")},
    }
    figures: dict[str, dict[str, float]] = {}
    with serve:
        for listener, conf in settings.items():
            topic = f"sec-{listener.lower()}-{uuid.uuid4().hex[:6]}"
            admin = AdminClient(conf)
            admin.create_topics([NewTopic(topic, 4)])[topic].result(30)
            produced, produce_s = _produce(conf, topic)
            read, read_s = _catch_up(conf, topic, produced)
            figures[listener] = {"produce": produced * RECORD / MiB / produce_s, "read": read * RECORD / MiB / read_s,
                                 "records": produced}
            log(f"security: {listener}: produce {figures[listener]['produce']:.1f} MiB/s, catch-up read "
                f"{figures[listener]['read']:.1f} MiB/s ({produced} records)")
    for phase in ("produce", "read"):
        base = figures["PLAINTEXT"][phase]
        ctx.add(Result("security", f"{phase}_plaintext_mib_s", round(base, 3), "MiB/s", "local", [],
                       {"record_bytes": RECORD, "phase_s": PHASE_S}, figures["PLAINTEXT"]))
        ctx.add(Result("security", f"{phase}_sasl_ssl_mib_s", round(figures["SASL_SSL"][phase], 3), "MiB/s", "local",
                       [Reference("target", round(TARGET_RATIO * base, 3), "MiB/s", "higher",
                                  f"{TARGET_RATIO:.0%} of PLAINTEXT in the same run")],
                       {"record_bytes": RECORD, "phase_s": PHASE_S, "mechanism": "SCRAM-SHA-512"},
                       figures["SASL_SSL"]))


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
