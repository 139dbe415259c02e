"""The shard's produce path alone: CPU per MiB of one in-process shard (ShardHost) under raw Produce requests.

`python -m benchmarks.produce_path --partitions 16 --records 64` starts a shard (ShardHost) in this process (embedded
metadata and local object store, uvloop, the startup heap frozen and the serving GC thresholds set, as in a
shard actor) and a sender in another process that writes pre-encoded Produce v9 requests (acks=all, 1 KiB
records, one partition per request by default: librdkafka's shape) with up to --window requests in flight.
It prints the shard process's user and system CPU and its event-loop thread's CPU per MiB.

Why it exists: the full produce benchmark moves by ±10 % between identical runs on this VM, while this one
measures only the broker's own CPU for a fixed amount of work, to a few per cent. Compare two versions by
running it alternately from two checkouts (PYTHONPATH=<checkout>, run from that directory). Note that the
metadata store runs in this process too (in a deployment it is the metadata actor or etcd).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import os
import resource
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time

from kafscale.actors.heap import tune_gc_for_serving


def _frames(partitions: int, per_request: int, records: int) -> list[bytes]:
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    from kafscale.protocol import encode_request, make, request_class

    mod = sys.modules[request_class(0, 9).__module__]
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 24)
    for i in range(records):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=None, value=os.urandom(1024), headers=[])
    batch = bytes(builder.build())
    frames = []
    for first in range(0, partitions * per_request, per_request):
        parts = tuple(make(mod.PartitionProduceData, index=(first + k) % partitions, records=batch)
                      for k in range(per_request))
        request = make(request_class(0, 9), transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=30),
                       topic_data=(make(mod.TopicProduceData, name="t", partition_data=parts),))
        frames.append(encode_request(request, len(frames)))
    return frames


def send(port: int, frames: list[bytes], requests: int, window: int) -> None:
    """The sender process: pipelined requests, responses read by a second thread."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = sock.makefile("rb")
    answered = 0

    def read() -> None:
        nonlocal answered
        while answered < requests:
            size = struct.unpack(">i", reader.read(4))[0]
            reader.read(size)
            answered += 1

    thread = threading.Thread(target=read)
    thread.start()
    for sent in range(requests):
        while sent - answered >= window:
            time.sleep(0.0005)
        sock.sendall(frames[sent % len(frames)])
    thread.join()
    sock.close()


async def measure(args: argparse.Namespace) -> dict[str, float]:
    from kafscale.actors.shard_host import ShardHost
    from kafscale.config import BrokerConfig
    from kafscale.storage.embedded_store import EmbeddedStore
    from kafscale.storage.local_store import LocalDirStore

    work = tempfile.mkdtemp(prefix="produce-path-", dir=args.dir)
    try:
        shard = ShardHost(0, BrokerConfig(listen="127.0.0.1:0", flush_interval_ms=args.flush_interval_ms),
                          meta=EmbeddedStore(f"{work}/meta.db"), objects=LocalDirStore(f"{work}/objects"))
        port = (await shard.start()).port
        await shard.core.topics.create("t", args.partitions, [0])
        await asyncio.sleep(1)  # the partitions open at creation
        tune_gc_for_serving()
        sender = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks.produce_path", "--send", str(port), *sys.argv[1:])
        before, started, loop_cpu = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter(), time.thread_time()
        await sender.wait()
        after, wall, loop_cpu = (resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - started,
                                 time.thread_time() - loop_cpu)
        await shard.stop()
        await shard.meta.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    mib = args.requests * args.per_request * args.records * 1.03 / 1024  # 1 KiB values plus record overhead
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    return {"mib_s": round(mib / wall, 1), "user_ms_per_mib": round(user * 1000 / mib, 2),
            "system_ms_per_mib": round(system * 1000 / mib, 2),
            "loop_thread_ms_per_mib": round(loop_cpu * 1000 / mib, 2), "cores": round((user + system) / wall, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--per-request", type=int, default=1, help="partitions in each request")
    parser.add_argument("--records", type=int, default=64, help="1 KiB records per partition and request")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--window", type=int, default=1000, help="requests in flight")
    parser.add_argument("--flush-interval-ms", type=int, default=50)
    parser.add_argument("--dir", default=None, help="where the stores go (a temporary directory, removed after)")
    parser.add_argument("--send", type=int, default=None, help=argparse.SUPPRESS)  # the sender process
    args = parser.parse_args()
    if args.send is not None:
        send(args.send, _frames(args.partitions, args.per_request, args.records), args.requests, args.window)
        return
    import uvloop

    gc.collect()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        print(runner.run(measure(args)))


if __name__ == "__main__":
    main()
