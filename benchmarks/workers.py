"""Client-side worker processes: `python -m benchmarks.workers KIND JSON-PARAMS`.

Each worker prints JSON lines on stdout (a handshake line where the harness needs one, the result
last) and nothing else there; diagnostics go to stderr. They run in their own interpreter so the
Kafka client (librdkafka through confluent-kafka) has a process of its own.
"""

from __future__ import annotations

import json
import math
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from benchmarks.compaction_worker import build_log, clean_pass, produce_keyed
from benchmarks.group_joins_worker import group_joins
from benchmarks.spark_kafka_worker import spark_reads
from benchmarks.txn_worker import txn_produce

MiB = 1024 * 1024
_TS = struct.Struct("<d")


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100.0 * len(ordered)) - 1))
    return ordered[rank]


def latency_summary(seconds: list[float]) -> dict[str, Any]:
    ms = [s * 1000.0 for s in seconds]
    return {
        "count": len(ms),
        "p50_ms": pct(ms, 50), "p90_ms": pct(ms, 90), "p99_ms": pct(ms, 99), "p999_ms": pct(ms, 99.9),
        "max_ms": max(ms) if ms else None, "mean_ms": (sum(ms) / len(ms)) if ms else None,
        # A coarse histogram (log-spaced ms buckets) so the harness can plot a distribution cheaply.
        "hist": _histogram(ms),
    }


def _histogram(ms: list[float]) -> list[list[float]]:
    edges = [0.5 * 1.25**i for i in range(60)]
    counts = [0] * len(edges)
    import bisect

    for v in ms:
        counts[min(len(edges) - 1, bisect.bisect_left(edges, v))] += 1
    return [[e, c] for e, c in zip(edges, counts, strict=True) if c]


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


# -- producer -------------------------------------------------------------------------------------------------


def produce(p: dict[str, Any]) -> dict[str, Any]:
    """Produce for `duration` seconds (after `warmup`), flat out or at `rate` records/s.

    Throughput counts deliveries inside the measuring window; latency is librdkafka's per-message
    latency (produce() call to delivery report), from the delivery callback, for records produced after
    the warm-up. With `timestamp_payload` the first 8 bytes carry time.time() for end-to-end latency.

    Flat out, only every `sample_every`-th record of each partition (default 16) gets a delivery callback,
    and each callback stands for that many records: a Python callback per record cost the client about
    0.6 core-ms per MiB (a fifth of its CPU) on the machine it shares with the broker. Kafka's own
    ProducerPerformance samples its latencies too. A failed request fails whole batches, and every batch
    holds sampled records, so errors are still seen. At a fixed rate or count every record is sampled.
    """
    from confluent_kafka import Producer

    conf = {
        "bootstrap.servers": p["bootstrap"],
        "acks": str(p.get("acks", "all")),
        "linger.ms": p.get("linger_ms", 5),
        "batch.size": p.get("batch_size", MiB),
        "queue.buffering.max.kbytes": p.get("queue_kbytes", 32 * 1024),
        "queue.buffering.max.messages": 2_000_000,
        "message.max.bytes": 16 * MiB,
        "compression.type": "none",
        "enable.idempotence": False,
        "request.timeout.ms": 30000,
        "message.timeout.ms": 120000,
    }
    conf.update(p.get("conf", {}))
    producer = Producer(conf)
    topic, partitions, size = p["topic"], int(p["partitions"]), int(p["size"])
    duration, warmup, rate = float(p["duration"]), float(p.get("warmup", 1.0)), float(p.get("rate", 0))
    stamp = bool(p.get("timestamp_payload", False))
    payload = os.urandom(size)
    pad = payload[_TS.size:]
    # Make sure metadata is there before the clock starts.
    producer.list_topics(topic, timeout=30)

    latencies: list[float] = []
    state = {"window_msgs": 0, "window_bytes": 0, "errors": 0, "delivered": 0, "first_error": "", "queue_full": 0}
    t0 = time.monotonic()
    measure_from, measure_to = t0 + warmup, t0 + warmup + duration
    mono = time.monotonic

    count = int(p.get("count", 0))  # count mode: send exactly this many, every one measured
    every = 1 if (count or rate > 0) else max(1, int(p.get("sample_every", 16)))

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            state["errors"] += every
            if not state["first_error"]:
                state["first_error"] = str(err)
            return
        state["delivered"] += every
        now = mono()
        if measure_from <= now <= measure_to:
            state["window_msgs"] += every
            state["window_bytes"] += size * every

    measured_lat: list[float] = latencies

    def on_delivery_lat(err: Any, msg: Any) -> None:
        on_delivery(err, msg)
        if err is None:
            measured_lat.append(msg.latency())

    sent = 0
    i = 0
    cpu0 = None
    produce_fn = producer.produce
    poll = producer.poll
    if count:
        measure_from, measure_to = t0, float("inf")
    while True:
        now = mono()
        if (count and sent >= count) or now >= measure_to:
            break
        if cpu0 is None and now >= measure_from:
            cpu0 = cpu_seconds()
        if rate > 0 and sent >= rate * (now - t0):
            poll(0.001)
            continue
        value = (_TS.pack(time.time()) + pad) if stamp else payload
        try:
            if (i // partitions) % every == 0:  # per partition, so samples do not all land on one
                cb = on_delivery_lat if now >= measure_from else on_delivery
                produce_fn(topic, value, partition=i % partitions, on_delivery=cb)
            else:
                produce_fn(topic, value, partition=i % partitions)
        except BufferError:  # the client's queue is full of unacknowledged records: waiting on the broker
            if measure_from <= now:
                state["queue_full"] += 1
            poll(0.002)
            continue
        sent += 1
        i += 1
        if i % 500 == 0:
            poll(0)
    cpu1 = cpu_seconds()
    remaining = producer.flush(300)
    if count:
        duration = mono() - t0
    return {
        "sent": sent, "delivered": min(sent, state["delivered"]), "errors": state["errors"],
        "first_error": state["first_error"],
        "undelivered": remaining, "window_s": duration,
        "records_per_s": state["window_msgs"] / duration, "mib_per_s": state["window_bytes"] / duration / MiB,
        "client_cpu_fraction": (cpu1 - (cpu0 or cpu1)) / duration, "latency_sample_every": every,
        "queue_full_waits": state["queue_full"],
        "latency": latency_summary(latencies),
    }


# -- consumers ------------------------------------------------------------------------------------------------


def _consumer(bootstrap: str, extra: dict[str, Any] | None = None) -> Any:
    from confluent_kafka import Consumer

    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": f"bench-{os.getpid()}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": False,
        "fetch.wait.max.ms": 100,
        "fetch.max.bytes": 64 * MiB,
        "max.partition.fetch.bytes": 8 * MiB,
        "receive.message.max.bytes": 128 * MiB,
        "queued.max.messages.kbytes": 256 * 1024,
    }
    conf.update(extra or {})
    return Consumer(conf)


def e2e_consume(p: dict[str, Any]) -> dict[str, Any]:
    """Assign every partition at its high watermark, say ready, then record receive - send time."""
    from confluent_kafka import TopicPartition

    consumer = _consumer(p["bootstrap"], p.get("conf"))
    topic, partitions = p["topic"], int(p["partitions"])
    tps = []
    for part in range(partitions):
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, part), timeout=30)
        tps.append(TopicPartition(topic, part, high))
    consumer.assign(tps)
    consumer.consume(num_messages=1, timeout=0.5)  # connect and start fetching before the producer starts
    emit({"ready": True})
    expect, deadline = int(p["expect"]), time.monotonic() + float(p["timeout"])
    skip_before = time.time() + float(p.get("skip_first_s", 0))
    latencies: list[float] = []
    received = 0
    while received < expect and time.monotonic() < deadline:
        # poll(), not consume(n, timeout): consume() waits until n records or the timeout, which would
        # add up to the timeout to every latency at a moderate rate.
        msg = consumer.poll(0.1)
        if msg is not None:
            if msg.error():
                continue
            now = time.time()
            sent = _TS.unpack_from(msg.value())[0]
            received += 1
            if sent >= skip_before:
                latencies.append(now - sent)
    consumer.close()
    return {"received": received, "latency": latency_summary(latencies)}


def catchup(p: dict[str, Any]) -> dict[str, Any]:
    """Read `expect` records from the beginning of every partition; MiB/s from assign() to the last record."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    consumer = _consumer(p["bootstrap"], p.get("conf"))
    topic, partitions = p["topic"], int(p["partitions"])
    expect, deadline = int(p["expect"]), time.monotonic() + float(p["timeout"])
    consumer.list_topics(topic, timeout=30)
    t0 = time.monotonic()
    consumer.assign([TopicPartition(topic, part, OFFSET_BEGINNING) for part in range(partitions)])
    received = nbytes = 0
    first = None
    samples: list[list[float]] = []
    next_sample = t0 + 0.5
    while received < expect and time.monotonic() < deadline:
        for msg in consumer.consume(num_messages=2000, timeout=0.05):
            if msg.error():
                continue
            if first is None:
                first = time.monotonic()
            received += 1
            nbytes += len(msg)
        now = time.monotonic()
        if now >= next_sample:
            samples.append([round(now - t0, 3), nbytes])
            next_sample = now + 0.5
    t1 = time.monotonic()
    consumer.close()
    elapsed = t1 - t0
    return {"received": received, "bytes": nbytes, "elapsed_s": elapsed, "mib_per_s": nbytes / MiB / elapsed,
            "first_record_s": None if first is None else first - t0, "progress": samples,
            "complete": received >= expect}


# -- admin ----------------------------------------------------------------------------------------------------


def create_topics(p: dict[str, Any]) -> dict[str, Any]:
    """Create topics (name, partitions) in batches of `batch` per CreateTopics request."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": p["bootstrap"]})
    topics = [NewTopic(name, num_partitions=int(n), replication_factor=1) for name, n in p["topics"]]
    batch = int(p.get("batch", 10))
    t0 = time.monotonic()
    errors = []
    per_batch = []
    for i in range(0, len(topics), batch):
        b0 = time.monotonic()
        futures = admin.create_topics(topics[i:i + batch], operation_timeout=120, request_timeout=180)
        for name, fut in futures.items():
            try:
                fut.result(timeout=300)
            except Exception as exc:  # TOPIC_ALREADY_EXISTS and friends are reported, not fatal
                errors.append(f"{name}: {exc}")
        per_batch.append(time.monotonic() - b0)
    return {"elapsed_s": time.monotonic() - t0, "errors": errors, "per_batch_s": per_batch}


def metadata_latency(p: dict[str, Any]) -> dict[str, Any]:
    """Time Metadata requests: all topics, and one topic, `iterations` times each."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": p["bootstrap"]})
    admin.list_topics(timeout=60)  # connect
    out: dict[str, Any] = {}
    for label, topic in (("all_topics", None), ("one_topic", p.get("topic"))):
        if label == "one_topic" and topic is None:
            continue
        lat: list[float] = []
        partitions = 0
        for _ in range(int(p.get("iterations", 20))):
            t0 = time.perf_counter()
            md = admin.list_topics(topic=topic, timeout=60)
            lat.append(time.perf_counter() - t0)
            partitions = sum(len(t.partitions) for t in md.topics.values())
        out[label] = {"partitions_seen": partitions, **latency_summary(lat)}
    return out


def touch_partitions(p: dict[str, Any]) -> dict[str, Any]:
    """One small record to every partition of every topic (acks=1), so every partition owner opens."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": p["bootstrap"], "acks": "1", "linger.ms": 20,
                         "queue.buffering.max.messages": 2_000_000, "message.timeout.ms": 300000})
    errors = {"n": 0, "first": ""}

    def cb(err: Any, _msg: Any) -> None:
        if err is not None:
            errors["n"] += 1
            errors["first"] = errors["first"] or str(err)

    t0 = time.monotonic()
    count = 0
    for name, n in p["topics"]:
        for part in range(int(n)):
            producer.produce(name, b"x" * 16, partition=part, on_delivery=cb)
            count += 1
        producer.poll(0)
    left = producer.flush(600)
    return {"records": count, "elapsed_s": time.monotonic() - t0, "errors": errors["n"],
            "first_error": errors["first"], "undelivered": left}


# -- limits ---------------------------------------------------------------------------------------------------


def store_limits(p: dict[str, Any]) -> dict[str, Any]:
    """Raw PUT then GET of `count` objects of `object_mib` MiB through the store backend, 1..N threads
    (`put_only`: no GETs)."""
    from concurrent.futures import ThreadPoolExecutor

    if p["backend"] == "local":
        from kafscale.storage.local_store import LocalDirStore

        store: Any = LocalDirStore(p["root"])
    else:
        from kafscale.storage.s3_store import S3Store

        store = S3Store(p["bucket"], endpoint_url=p["endpoint"], access_key=p["access_key"],
                        secret_key=p["secret_key"], create_bucket=True)
    data = os.urandom(int(p["object_mib"] * MiB))
    count = int(p["count"])
    out: dict[str, Any] = {}
    for threads in p["threads"]:
        keys = [f"limits/t{threads}/obj-{i:05d}" for i in range(count)]
        warm = [f"limits/t{threads}/warm-{i:05d}" for i in range(threads)]
        with ThreadPoolExecutor(threads) as pool:
            # Untimed: the first PUT in a process pays botocore's lazy set-up (~0.2 s, docs/performance.md),
            # and each thread its connection; on a 1 s measurement that alone cost up to a fifth.
            list(pool.map(lambda k: store.put(k, data), warm))
            for k in warm:
                store.delete(k)
            t0 = time.perf_counter()
            list(pool.map(lambda k: store.put(k, data), keys))
            put_s = time.perf_counter() - t0
            total = count * len(data)
            entry: dict[str, Any] = {"put_mib_s": total / MiB / put_s, "put_s": put_s}
            if not p.get("put_only"):
                t0 = time.perf_counter()
                sizes = list(pool.map(lambda k: len(store.get(k)), keys))
                get_s = time.perf_counter() - t0
                assert sum(sizes) == total
                cold_s = None
                if p.get("drop_dir"):
                    _drop_page_cache(p["drop_dir"])
                    t0 = time.perf_counter()
                    list(pool.map(lambda k: len(store.get(k)), keys))
                    cold_s = time.perf_counter() - t0
                entry.update(get_mib_s=total / MiB / get_s, get_s=get_s,
                             cold_get_mib_s=total / MiB / cold_s if cold_s else None)
        out[str(threads)] = entry
        for k in keys:
            store.delete(k)
    store.close()
    return out


def _drop_page_cache(root: str) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass
            finally:
                os.close(fd)


def tcp_recv(p: dict[str, Any]) -> dict[str, Any]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    emit({"port": srv.getsockname()[1]})
    conn, _ = srv.accept()
    buf = bytearray(4 * MiB)
    view = memoryview(buf)
    total = 0
    t0 = None
    while True:
        n = conn.recv_into(view)
        if not n:
            break
        if t0 is None:
            t0 = time.perf_counter()
        total += n
    elapsed = time.perf_counter() - (t0 or time.perf_counter())
    conn.close()
    srv.close()
    return {"bytes": total, "elapsed_s": elapsed, "mib_per_s": total / MiB / elapsed if elapsed else 0.0}


def tcp_send(p: dict[str, Any]) -> dict[str, Any]:
    chunk = os.urandom(int(p.get("chunk", MiB)))
    sock = socket.create_connection(("127.0.0.1", int(p["port"])))
    total = 0
    t0 = time.perf_counter()
    end = t0 + float(p["duration"])
    while time.perf_counter() < end:
        sock.sendall(chunk)
        total += len(chunk)
    sock.close()
    return {"bytes": total, "elapsed_s": time.perf_counter() - t0}


KINDS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "produce": produce, "e2e_consume": e2e_consume, "catchup": catchup, "create_topics": create_topics,
    "metadata_latency": metadata_latency, "touch_partitions": touch_partitions, "store_limits": store_limits,
    "tcp_recv": tcp_recv, "tcp_send": tcp_send, "txn_produce": txn_produce, "build_log": build_log,
    "clean_pass": clean_pass, "produce_keyed": produce_keyed, "spark_reads": spark_reads, "group_joins": group_joins,
}


def main() -> None:
    kind, params = sys.argv[1], json.loads(sys.argv[2])
    # A worker must never outlive the harness: exit when the parent goes away.
    parent = os.getppid()

    def watch_parent() -> None:
        while True:
            time.sleep(1)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch_parent, daemon=True).start()
    emit(KINDS[kind](params))


if __name__ == "__main__":
    main()
