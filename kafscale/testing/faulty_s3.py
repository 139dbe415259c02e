"""A fault-injecting HTTP proxy in front of a real S3 server, for tests: a real server cannot be made to throttle,
fail or stall on demand, and S3 does all three under load.

Each request is either forwarded as it is (the Host header kept, so SigV4 signatures still match) or, at the
rates set, meets a fault:

- `slowdown`: 503 SlowDown, as S3 answers a request rate it will not take;
- `internal`: 500 InternalError;
- `reset_before`: the connection is cut before the request reaches the server (nothing happened);
- `reset_after`: the request is forwarded and done, then the connection is cut before the answer (the ambiguous
  case: a PUT took effect that the client thinks failed);
- `stall`: the answer comes `stall_s` late.

Rates can change while it runs (`set_rates`), so a test can turn the faults on and off.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter
from typing import Any

import aiohttp
from aiohttp import web

FAULTS = ("slowdown", "internal", "reset_before", "reset_after", "stall")
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "upgrade", "te", "trailer"}
_ERROR_BODY = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
               "<RequestId>faulty-s3</RequestId></Error>")


class FaultyS3Proxy:
    def __init__(self, upstream: str, *, stall_s: float = 2.0, seed: int | None = None) -> None:
        self.upstream = upstream.rstrip("/")  # http://host:port
        self.stall_s = stall_s
        self.rates: dict[str, float] = dict.fromkeys(FAULTS, 0.0)
        self.faults: Counter[str] = Counter()  # faults made, by kind
        self.forwarded = 0
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0
        self._thread = threading.Thread(target=self._main, name="faulty-s3", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the faulty S3 proxy did not start")

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_rates(self, **rates: float) -> None:
        """Rates of each fault per request (unnamed ones go to 0); their sum must stay at or under 1."""
        unknown = set(rates) - set(FAULTS)
        if unknown or sum(rates.values()) > 1:
            raise ValueError(f"fault rates: unknown {sorted(unknown)} or a sum over 1: {rates}")
        with self._lock:
            self.rates = {f: float(rates.get(f, 0.0)) for f in FAULTS}

    def _pick(self) -> str | None:
        with self._lock:
            roll, total = self._random.random(), 0.0
            for fault, rate in self.rates.items():
                total += rate
                if roll < total:
                    self.faults[fault] += 1
                    return fault
            self.forwarded += 1
            return None

    # ---------------------------------------------------------------- the server, on its own thread

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession(auto_decompress=False, timeout=aiohttp.ClientTimeout(total=120))
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server: Any = site._server  # aiohttp exposes the bound socket only here
        self.port = server.sockets[0].getsockname()[1]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        fault = self._pick()
        body = await request.read()
        if fault == "slowdown":
            return _error(503, "SlowDown", "Please reduce your request rate.")
        if fault == "internal":
            return _error(500, "InternalError", "We encountered an internal error. Please try again.")
        if fault == "reset_before":
            return _cut(request)
        if fault == "stall":
            await asyncio.sleep(self.stall_s)
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        async with self._session.request(request.method, self.upstream + request.rel_url.raw_path_qs,
                                         headers=headers, data=body if body else None,
                                         skip_auto_headers=("Content-Type", "User-Agent", "Accept",
                                                            "Accept-Encoding")) as answer:
            payload = await answer.read()
            if fault == "reset_after":
                return _cut(request)
            out = web.Response(status=answer.status, body=payload if request.method != "HEAD" else None,
                               headers={k: v for k, v in answer.headers.items() if k.lower() not in _HOP_BY_HOP})
            if request.method == "HEAD" and "Content-Length" in answer.headers:
                out.headers["Content-Length"] = answer.headers["Content-Length"]
            return out

    def close(self) -> None:
        async def stop() -> None:
            if self._runner is not None:
                await self._runner.cleanup()
            if self._session is not None:
                await self._session.close()

        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def _error(status: int, code: str, message: str) -> web.Response:
    return web.Response(status=status, text=_ERROR_BODY.format(code=code, message=message),
                        content_type="application/xml")


def _cut(request: web.Request) -> web.Response:
    transport = request.transport
    if transport is not None:
        transport.abort()  # an RST-like end: the client sees a reset connection, no answer
    return web.Response(status=500)  # never sent: the transport is gone
