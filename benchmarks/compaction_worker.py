"""The cleaning pass of the `compaction` scenario, run as a worker (`benchmarks.workers`): a process of its own, so
its peak memory is the pass's (plus an interpreter), measured by the kernel (ru_maxrss).

It writes a keyed log straight into a local object directory (`keys` distinct keys, `versions` values each, in
random order, 100-byte values, 500 records a batch, segments of `segment_mib`), then times one pass over it with the
broker's own code (kafscale.broker.cleaning.clean_with_store) and reports its CPU time, wall time, bytes read and
written, and the process's peak resident memory before and after.
"""

from __future__ import annotations

import random
import resource
import time
from pathlib import Path
from typing import Any

MiB = 1024 * 1024
BATCH = 500
VALUE = 100


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def build_log(p: dict[str, Any]) -> dict[str, Any]:
    """Write the keyed log into `dir`; its segment records (as the metadata store holds them)."""
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    from kafscale.cluster.records import SegmentMeta
    from kafscale.storage.local_store import LocalDirStore
    from kafscale.storage.segment import build_segment

    keys, versions, codec = int(p["keys"]), int(p["versions"]), int(p.get("codec", 0))
    segment_bytes = int(p["segment_mib"]) * MiB
    store = LocalDirStore(Path(p["dir"]) / "objects")
    rng = random.Random(7)
    order = [k for _ in range(versions) for k in range(keys)]
    rng.shuffle(order)
    segments: list[SegmentMeta] = []
    offset, pending, size = 0, [], 0
    now = int(time.time() * 1000)

    def seal() -> None:
        nonlocal pending, size
        built = build_segment(pending, created_ms=now)
        meta = SegmentMeta.from_info(built.info)
        at = meta.stored("bench", "t", 0)
        store.put(at.key, built.data)
        store.put(at.index_key, built.index)
        segments.append(meta)
        pending, size = [], 0

    value = bytes(rng.getrandbits(8) for _ in range(VALUE))
    for start in range(0, len(order), BATCH):
        builder = DefaultRecordBatchBuilder(2, codec, 0, -1, -1, -1, 1 << 30)
        for i, k in enumerate(order[start : start + BATCH]):
            builder.append(i, timestamp=now, key=b"key-%09d" % k, value=value, headers=[])
        batch = bytearray(builder.build())
        batch[0:8] = offset.to_bytes(8, "big")
        offset += min(BATCH, len(order) - start)
        pending.append(batch)
        size += len(batch)
        if size >= segment_bytes:
            seal()
    if pending:
        seal()
    return {"records": len(order), "segments": [s.to_value() for s in segments], "now_ms": now}


def clean_pass(p: dict[str, Any]) -> dict[str, Any]:
    """One pass over the log `build_log` wrote, in this fresh process: CPU, wall time, peak memory, output."""
    from kafscale.broker.cleaning import clean_with_store
    from kafscale.cluster.records import SegmentMeta
    from kafscale.compaction.cleaner import Job
    from kafscale.storage.local_store import LocalDirStore

    store = LocalDirStore(Path(p["dir"]) / "objects")
    segments = tuple(SegmentMeta.from_value(v) for v in p["segments"])
    job = Job("bench", "t", 0, 1, 1, segments, 0, (), int(p["now_ms"]), 86_400_000, int(p["segment_mib"]) * MiB,
              int(p["map_entries"]))
    rss0, cpu0, t0 = _rss_mib(), _cpu(), time.perf_counter()
    outcome = clean_with_store(job, store)
    cpu, wall, rss1 = _cpu() - cpu0, time.perf_counter() - t0, _rss_mib()
    new = [r.new for r in outcome.replacements]
    return {"log_bytes": sum(s.size for s in segments), "cpu_s": cpu, "wall_s": wall,
            "bytes_read": outcome.stats.bytes_read, "bytes_written": sum(s.size for s in new),
            "records_kept": sum(s.records for s in new), "cleaned_to": outcome.cleaned_to,
            "rss_before_mib": rss0, "rss_peak_mib": rss1}


def produce_keyed(p: dict[str, Any]) -> dict[str, Any]:
    """`versions` values of each of `keys` keys, in random order (acks=all), as fast as the broker takes them or at
    `rate` records a second."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": p["bootstrap"], "acks": "all", "linger.ms": 20, "batch.size": MiB,
                         "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 256 * 1024,
                         "compression.type": "none"})
    rng = random.Random(11)
    order = [k for _ in range(int(p["versions"])) for k in range(int(p["keys"]))]
    rng.shuffle(order)
    value = bytes(rng.getrandbits(8) for _ in range(int(p.get("value_bytes", VALUE))))
    rate = float(p.get("rate", 0))  # records a second; 0: as fast as the broker takes them
    failed = []
    t0 = time.perf_counter()
    for i, k in enumerate(order):
        if rate and i % 100 == 0 and (ahead := i / rate - (time.perf_counter() - t0)) > 0:
            time.sleep(ahead)
        while True:
            try:
                producer.produce(p["topic"], key=b"key-%09d" % k, value=value,
                                 on_delivery=lambda err, _msg: failed.append(str(err)) if err else None)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    left = producer.flush(120)
    return {"records": len(order), "seconds": time.perf_counter() - t0, "undelivered": left,
            "errors": len(failed), "first_error": failed[0] if failed else None}
