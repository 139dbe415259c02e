"""Each shard's HTTP endpoint: /metrics (Prometheus), /healthz (alive), /readyz (able to serve).

/readyz checks, each with a short timeout, what a load balancer needs before sending clients here:
the Kafka listener accepts connections, the metadata store answers, and the object store answers a
probe (a HEAD of `{namespace}/__health/probe`, through the shard's store so the S3 health tracker
sees it too) and is not judged unavailable. The answer is 200 or 503 with a JSON body naming each check.

The endpoint binds 127.0.0.1 unless told otherwise. Exposed further, it can serve HTTPS (the broker's certificate,
reloaded when the files change) and ask for a bearer token on /metrics and /readyz, which name topics, groups
and store errors; /healthz says only "alive" and stays open for liveness probes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from kafscale.cluster import keys
from kafscale.security.bearer import BearerToken
from kafscale.security.tls import ServerTls
from kafscale.storage.health import HealthState
from kafscale.storage.metadata_store import MetadataStore

log = logging.getLogger(__name__)
CHECK_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class ReadinessChecks:
    """What /readyz asks: the Kafka listener's address, the stores, and the object store's health state."""

    listener: tuple[str, int]
    metadata_store: MetadataStore
    probe_object_store: Callable[[], Awaitable[None]]
    s3_state: Callable[[], HealthState]


async def readiness(shard_id: int, c: ReadinessChecks) -> dict[str, Any]:
    async def listening() -> None:
        host, port = c.listener
        _, writer = await asyncio.open_connection("127.0.0.1" if host in ("0.0.0.0", "") else host, port)
        writer.close()

    async def metadata() -> None:
        await c.metadata_store.get(keys.CLUSTER)

    async def objects() -> None:
        await c.probe_object_store()
        if c.s3_state() == HealthState.UNAVAILABLE:
            raise RuntimeError("object store judged unavailable (errors or latency over the health window)")

    checks: dict[str, Any] = {}
    for name, check in (("listener", listening), ("metadata_store", metadata), ("object_store", objects)):
        try:
            await asyncio.wait_for(check(), CHECK_TIMEOUT_S)
            checks[name] = "ok"
        except TimeoutError:
            checks[name] = f"no answer within {CHECK_TIMEOUT_S}s"
        except Exception as e:
            checks[name] = f"failed: {e}"
    return {"ready": all(v == "ok" for v in checks.values()), "shard": shard_id,
            "s3_health": c.s3_state().name.lower(), "checks": checks}


class MetricsServer:
    def __init__(self, shard_id: int, registry: CollectorRegistry, checks: Callable[[], ReadinessChecks], host: str,
                 port: int, *, tls: ServerTls | None = None, token: BearerToken | None = None) -> None:
        self.shard_id = shard_id
        self.registry = registry
        self.checks = checks
        self.host = host
        self.port = port  # the bound port after start() (0 picks a free one)
        self.tls = tls
        self.token = token
        self._runner: web.AppRunner | None = None
        self._reloader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        app = web.Application(middlewares=[self._guard] if self.token is not None else [])
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port,
                           ssl_context=self.tls.context if self.tls is not None else None)
        await site.start()
        server = site._server  # aiohttp exposes the bound sockets only here
        if server is not None and getattr(server, "sockets", None):
            self.port = server.sockets[0].getsockname()[1]
        if self.tls is not None:
            self._reloader = asyncio.get_running_loop().create_task(self.tls.keep_current())
        log.info("shard %d metrics on %s://%s:%d/metrics%s", self.shard_id, "https" if self.tls else "http",
                 self.host, self.port, " (bearer token required)" if self.token else "")

    @web.middleware
    async def _guard(self, request: web.Request,
                     handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        assert self.token is not None
        if request.path != "/healthz" and not self.token.admits(request.headers.get("Authorization")):
            log.warning("shard %d metrics: refused %s from %s (no valid bearer token)", self.shard_id,
                        request.path, request.remote)
            return web.Response(status=401, text="a bearer token is required\n",
                                headers={"WWW-Authenticate": 'Bearer realm="kafscale"'})
        return await handler(request)

    async def stop(self) -> None:
        if self._reloader is not None:
            self._reloader.cancel()
            self._reloader = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, _request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "alive", "shard": self.shard_id})

    async def _readyz(self, _request: web.Request) -> web.Response:
        result = await readiness(self.shard_id, self.checks())
        return web.Response(text=json.dumps(result), status=200 if result["ready"] else 503,
                            content_type="application/json")


def metrics_address(listen: str, shard_id: int) -> tuple[str, int] | None:
    """Shard N serves on the first shard's port + N ('' disables; port 0: each picks a free port)."""
    if not listen:
        return None
    host, _, port = listen.rpartition(":")
    base = int(port)
    return host or "127.0.0.1", (base + shard_id if base else 0)
