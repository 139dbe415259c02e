"""The `vs_kafka` scenario (issue 36): Kafscale beside Apache Kafka on this machine, measured with Kafka's own tools.

Apache Kafka 4.4.0 runs as a single-node KRaft broker with its start script's JVM settings and its default flush
settings: an acknowledged record is in the page cache, not on disk. Kafscale runs as `kafscale serve` (2 shards) on
each backend of the run: acks=all there means the segment is in the object store (a local directory, or SeaweedFS
over HTTP). Say so beside every figure.

Per case (record size x acks x idempotence x partitions), on each broker, on a topic of its own:
* ProducerPerformance (`org.apache.kafka.tools.ProducerPerformance`, the client's defaults apart from acks and
  idempotence): MiB/s and its latency p50/p99 as it reports them;
* ConsumerPerformance reading the same records back: MiB/s;
* the broker's CPU over both (utime + stime of the Kafka JVM, or of the serve process and its shards), per GiB;
* then the same with librdkafka as the second client (its defaults apart from acks and idempotence: the
  `produce` worker in count mode, and the `catchup` worker reading from the beginning), on a topic of its own.
Once per broker: EndToEndLatency (1 KiB, acks=all, 2,000 records) p50 and p99.

Each broker first serves one unmeasured case, so Kafka's JVM is compiled before it is measured. Each Kafscale
figure carries Kafka's as its reference, so results.json holds the ratio. `--quick` runs two cases of 32 MiB; the
full matrix is 100 B, 1 KiB, 16 KiB x acks=1, acks=all, acks=all idempotent x 1, 16, 256 partitions, 64 MiB a case
and client (one partition at acks=all is a few MiB/s on Kafscale: each batch waits for a flush tick).
"""

from __future__ import annotations

import contextlib
import itertools
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import (
    Broker,
    Context,
    GiB,
    MiB,
    Reference,
    Result,
    broker,
    log,
    process_cpu_seconds,
    run_worker,
)
from kafscale.testing.kafka_reference import LATEST, PRODUCTION_JVM_FLAGS, ReferenceKafka, find_java, lib_dir

TOOLS = "org.apache.kafka.tools"
# Idempotence needs acks=all (the Java client refuses it with acks=1): acks=1 runs plain only.
FULL_CASES = [(size, acks, idempotent, partitions)
              for size, (acks, idempotent), partitions in itertools.product(
                  (100, 1024, 16384), (("1", False), ("all", False), ("all", True)), (1, 16, 256))]
QUICK_CASES = [(1024, "all", True, 16), (100, "1", False, 1)]
CLIENTS = ("java", "librdkafka")


@dataclass(frozen=True, slots=True)
class Side:
    """One broker under comparison: its name, bootstrap address, and what its CPU is read from."""

    name: str
    bootstrap: str
    cpu: Callable[[], float]
    create: Callable[[str, int], None]


def _tool_log_config(work: Path) -> Path:
    path = work / "tools-log4j2.properties"
    path.write_text("status = error\nappender.err.type = Console\nappender.err.name = err\n"
                    "appender.err.target = SYSTEM_ERR\nappender.err.layout.type = PatternLayout\n"
                    "appender.err.layout.pattern = %p %m%n\nrootLogger.level = WARN\n"
                    "rootLogger.appenderRef.err.ref = err\n")
    return path


def _tool(work: Path, main: str, *args: str, timeout: float = 900) -> str:
    command = [find_java(), f"-Dlog4j2.configurationFile={_tool_log_config(work)}", "-cp",
               f"{lib_dir(LATEST)}/*", f"{TOOLS}.{main}", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=work)
    if done.returncode != 0:
        raise RuntimeError(f"{main} exited with {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def producer_performance(work: Path, side: Side, topic: str, size: int, count: int, acks: str,
             idempotent: bool) -> dict[str, float]:
    out = _tool(work, "ProducerPerformance", "--topic", topic, "--num-records", str(count), "--record-size",
                str(size), "--throughput", "-1", "--producer-props", f"bootstrap.servers={side.bootstrap}",
                f"acks={acks}", f"enable.idempotence={str(idempotent).lower()}")
    last = [line for line in out.splitlines() if "records sent" in line][-1]
    numbers = [float(x) for x in re.findall(r"([0-9.]+) (?:records sent|records/sec|MB/sec|ms)", last)]
    sent, per_s, mb_s = numbers[0], numbers[1], numbers[2]
    p50, p99 = (float(re.search(rf"([0-9.]+) ms {q}", last).group(1)) for q in ("50th", "99th"))  # type: ignore[union-attr]
    return {"records": sent, "records_s": per_s, "mib_s": mb_s * 1e6 / MiB, "p50_ms": p50, "p99_ms": p99}


def _consume(work: Path, side: Side, topic: str, count: int) -> float:
    out = _tool(work, "ConsumerPerformance", "--bootstrap-server", side.bootstrap, "--topic", topic, "--messages",
                str(count), "--timeout", "60000")
    header, row = [line for line in out.splitlines() if line.strip()][-2:]
    fields = dict(zip((h.strip() for h in header.split(",")), (v.strip() for v in row.split(",")), strict=False))
    return float(fields["MB.sec"]) * 1e6 / MiB


def _end_to_end(work: Path, side: Side, topic: str) -> dict[str, float]:
    out = _tool(work, "EndToEndLatency", side.bootstrap, topic, "2000", "all", "1024")
    p50, p99 = (float(re.search(rf"{q} = ([0-9.]+)", out).group(1)) for q in ("50th", "99th"))  # type: ignore[union-attr]
    return {"p50_ms": p50, "p99_ms": p99}


def _librdkafka(side: Side, topic: str, size: int, count: int, acks: str, idempotent: bool,
                partitions: int) -> dict[str, float]:
    """librdkafka (confluent-kafka) at its defaults: `linger.ms` 5, batches up to 1 MB, records spread over the
    partitions in turn, every delivery timed."""
    out = run_worker("produce", {"bootstrap": side.bootstrap, "topic": topic, "partitions": partitions,
                                 "size": size, "count": count, "duration": 0, "acks": acks,
                                 "conf": {"enable.idempotence": idempotent}}, timeout=1200)
    if out["errors"] or out["undelivered"]:
        raise RuntimeError(f"librdkafka on {side.name}, {topic}: {out['errors']} errors, {out['undelivered']} "
                           f"undelivered, first {out['first_error']!r}")
    read = run_worker("catchup", {"bootstrap": side.bootstrap, "topic": topic, "partitions": partitions,
                                  "expect": count, "timeout": 300}, timeout=600)
    if not read["complete"]:
        raise RuntimeError(f"librdkafka on {side.name}, {topic}: read {read['received']} of {count} records")
    latency = out["latency"]
    return {"records": count, "records_s": out["records_per_s"], "mib_s": out["mib_per_s"],
            "p50_ms": latency["p50_ms"], "p99_ms": latency["p99_ms"], "read_mib_s": read["mib_per_s"]}


def _case(work: Path, side: Side, case: tuple[int, str, bool, int], volume: int, client: str) -> dict[str, float]:
    size, acks, idempotent, partitions = case
    topic = f"vs-{side.name}-{client}-{size}-{acks}-{int(idempotent)}-{partitions}-{time.monotonic_ns() % 10**6}"
    side.create(topic, partitions)
    count = max(1000, volume // size)
    cpu0 = side.cpu()
    if client == "java":
        produced = producer_performance(work, side, topic, size, count, acks, idempotent)
        produced["read_mib_s"] = _consume(work, side, topic, count)
    else:
        produced = _librdkafka(side, topic, size, count, acks, idempotent, partitions)
    cpu = side.cpu() - cpu0
    gib = 2 * count * size / GiB  # written once, read once
    return {**produced, "cpu_s_per_gib": cpu / gib}


def _cases(work: Path, side: Side, cases: list[tuple[int, str, bool, int]],
           volume: int) -> dict[tuple[str, tuple[int, str, bool, int]], dict[str, float]]:
    """Every case with both clients, after one unmeasured case that warms the broker (Kafka's JIT)."""
    _case(work, side, (1024, "1", False, 16), 16 * MiB, "java")
    return {(client, case): _case(work, side, case, volume, client) for case in cases for client in CLIENTS}


def _kafka_side(kafka: ReferenceKafka, work: Path) -> Side:
    def create(topic: str, partitions: int) -> None:
        _tool(work, "TopicCommand", "--bootstrap-server", kafka.bootstrap, "--create", "--topic", topic,
              "--partitions", str(partitions), "--replication-factor", "1")

    return Side("kafka", kafka.bootstrap, lambda: process_cpu_seconds(kafka.pid or 0), create)


def kafscale_side(b: Broker, work: Path) -> Side:
    def cpu() -> float:
        pids = [*b.shard_pids().values()]
        if b.serve.proc is not None:
            pids.append(b.serve.proc.pid)
        total = 0.0
        for pid in pids:
            with contextlib.suppress(OSError):
                total += process_cpu_seconds(pid)
        return total

    def create(topic: str, partitions: int) -> None:
        _tool(work, "TopicCommand", "--bootstrap-server", b.bootstrap, "--create", "--topic", topic,
              "--partitions", str(partitions), "--replication-factor", "1")

    return Side(f"kafscale-{b.backend}", b.bootstrap, cpu, create)


@contextlib.contextmanager
def _reference(ctx: Context) -> Iterator[ReferenceKafka]:
    kafka = ReferenceKafka(LATEST, parent_dir=ctx.work, jvm_flags=PRODUCTION_JVM_FLAGS)
    with kafka:
        yield kafka


def vs_kafka(ctx: Context) -> None:
    cases = QUICK_CASES if ctx.quick else FULL_CASES
    volume = 32 * MiB if ctx.quick else 64 * MiB
    work = ctx.work / "vs-kafka"
    work.mkdir(exist_ok=True)
    with _reference(ctx) as kafka:
        kafka_side = _kafka_side(kafka, work)
        theirs = _cases(work, kafka_side, cases, volume)
        kafka_e2e = _end_to_end(work, kafka_side, f"vs-e2e-kafka-{time.monotonic_ns() % 10**6}")
        log(f"  kafka: {theirs}; end to end {kafka_e2e}")
        for backend in ctx.backends:
            with broker(ctx, backend, "vs_kafka") as b:
                side = kafscale_side(b, work)
                ours = _cases(work, side, cases, volume)
                for key, figures in ours.items():
                    log(f"  {side.name} {key}: {figures} (kafka {theirs[key]})")
                    _add(ctx, backend, key, figures, theirs[key])
                e2e = _end_to_end(work, side, f"vs-e2e-{backend}-{time.monotonic_ns() % 10**6}")
                for key in ("p50_ms", "p99_ms"):
                    ctx.add(Result("vs_kafka", f"end_to_end_{key}", e2e[key], "ms", backend,
                                   references=[_kafkas(kafka_e2e[key], "ms", "lower")],
                                   settings={"tool": "EndToEndLatency", "records": 2000, "size": 1024, "acks": "all"}))


def _kafkas(value: float, unit: str, better: str) -> Reference:
    return Reference("limit", round(value, 3), unit, better,
                     "Apache Kafka 4.4.0 on this machine, same tool and case (its log in the page cache)")


def _add(ctx: Context, backend: str, key: tuple[str, tuple[int, str, bool, int]], ours: dict[str, float],
         theirs: dict[str, float]) -> None:
    client, (size, acks, idempotent, partitions) = key
    name = f"{size}B_acks{acks}_{'idem' if idempotent else 'plain'}_p{partitions}"
    if client != "java":  # the names the Java tools' figures have had since the first run
        name = f"{name}_{client}"
    tools = ("ProducerPerformance, ConsumerPerformance" if client == "java" else
             "librdkafka: the produce worker (count mode), the catchup worker")
    settings: dict[str, Any] = {"record_size": size, "acks": acks, "enable.idempotence": idempotent,
                                "partitions": partitions, "records": ours["records"], "client": client,
                                "tools": f"{tools} (client defaults otherwise)"}
    for key, unit, better in (("mib_s", "MiB/s", "higher"), ("read_mib_s", "MiB/s", "higher"),
                              ("p50_ms", "ms", "lower"), ("p99_ms", "ms", "lower"),
                              ("cpu_s_per_gib", "CPU-s/GiB", "lower")):
        ctx.add(Result("vs_kafka", f"{name}_{key}", round(ours[key], 3), unit, backend,
                       references=[_kafkas(theirs[key], unit, better)], settings=settings))
