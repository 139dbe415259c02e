"""The `fetch_sessions` scenario (issue 36): what fetch sessions (KIP-227) save a consumer of many partitions.

A 1-shard broker and one topic of 1,000 empty partitions: a consumer that is up to date and polls. The same raw
Fetch v12 (max wait 0, min bytes 0), sent back to back over one connection:

* sessionless (session 0, epoch -1): every request names the 1,000 partitions and every answer lists them;
* in a session: one full fetch at epoch 0 opens it, then incremental fetches name nothing and are answered with
  nothing (no partition changed).

Reported per fetch, for each: request bytes, response bytes, and the shard's CPU (utime + stime of its process over
the run, divided by the fetches). The bytes are exact; the CPU depends on the machine's load, so its ratio (taken
in the same run) is the figure to read.
"""

from __future__ import annotations

import datetime
import socket
import sys
from typing import Any

from benchmarks.common import Broker, Context, Reference, Result, broker, log, run_worker
from kafscale.protocol import make, request_class
from kafscale.protocol.codec import decode_response
from kafscale.protocol.encoder import encode_request
from kafscale.protocol.framing import FrameBuffer

PARTITIONS = 1000
VERSION = 12
TOPIC = "fetch-sessions"


class _Fetcher:
    """Raw Fetch requests over one connection: (request bytes, response bytes, decoded answer) each."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.frames = FrameBuffer()
        self.ready: list[bytes] = []
        self.corr = 0

    def fetch(self, session_id: int, epoch: int, partitions: int) -> tuple[int, int, Any]:
        mod = sys.modules[request_class(1, VERSION).__module__]
        parts = tuple(make(mod.FetchPartition, partition=p, current_leader_epoch=-1, fetch_offset=0,
                           last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)
                      for p in range(partitions))
        request = make(request_class(1, VERSION), replica_id=-1, max_wait=datetime.timedelta(0), min_bytes=0,
                       max_bytes=50 << 20, isolation_level=0, session_id=session_id, session_epoch=epoch,
                       topics=(make(mod.FetchTopic, topic=TOPIC, partitions=parts),) if parts else (),
                       forgotten_topics_data=(), rack_id="")
        self.corr += 1
        frame = encode_request(request, self.corr, "bench")
        self.sock.sendall(frame)
        while not self.ready:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("the broker closed the connection")
            self.ready += self.frames.feed(data)
        payload = self.ready.pop(0)
        _, answer = decode_response(1, VERSION, payload)
        return len(frame), len(payload) + 4, answer

    def close(self) -> None:
        self.sock.close()


def _run(b: Broker, fetches: int, sessions: bool) -> dict[str, float]:
    fetcher = _Fetcher(int(b.bootstrap.rsplit(":", 1)[1]))
    try:
        session_id, epoch = 0, -1
        if sessions:
            _, _, opened = fetcher.fetch(0, 0, PARTITIONS)
            assert opened.session_id > 0, "the broker opened no fetch session"
            session_id, epoch = opened.session_id, 1
        request_bytes = response_bytes = 0
        cpu0 = b.shard_cpu()
        for _ in range(fetches):
            sent, got, answer = fetcher.fetch(session_id, epoch, 0 if sessions else PARTITIONS)
            assert answer.error_code == 0, answer.error_code
            request_bytes, response_bytes = request_bytes + sent, response_bytes + got
            if sessions:
                epoch += 1
        cpu = b.shard_cpu() - cpu0
    finally:
        fetcher.close()
    return {"request_bytes": request_bytes / fetches, "response_bytes": response_bytes / fetches,
            "shard_cpu_us": cpu / fetches * 1e6}


def fetch_sessions(ctx: Context) -> None:
    fetches = 300 if ctx.quick else 3000
    for backend in ctx.backends:
        with broker(ctx, backend, "fetch_sessions", shards=1) as b:
            made = run_worker("create_topics", {"bootstrap": b.bootstrap, "topics": [(TOPIC, PARTITIONS)],
                                                "batch": 1})
            if made["errors"]:
                raise RuntimeError(f"create {TOPIC}: {made['errors']}")
            plain = _run(b, fetches, sessions=False)
            incremental = _run(b, fetches, sessions=True)
            log(f"  sessionless {plain}; incremental {incremental}")
            settings = {"partitions": PARTITIONS, "fetches": fetches, "fetch_version": VERSION, "max_wait_ms": 0,
                        "state": "every partition empty and read to its end"}
            for key, unit in (("request_bytes", "B"), ("response_bytes", "B"), ("shard_cpu_us", "us")):
                ctx.add(Result("fetch_sessions", f"sessionless_fetch_{key}", round(plain[key], 1), unit, backend,
                               settings=settings))
                ctx.add(Result("fetch_sessions", f"incremental_fetch_{key}", round(incremental[key], 1), unit,
                               backend, settings=settings, references=[Reference(
                                   "limit", round(plain[key], 1), unit, "lower",
                                   "the same fetch without a session, measured in the same run")]))
