"""API key → handler table, and the context every handler receives."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from kafscale.protocol.codec import decode_request
from kafscale.protocol.schemas import has_schemas
from kafscale.security.principal import ANONYMOUS, Principal

if TYPE_CHECKING:
    from kafscale.acceptor.blocked_producers import WaitingProduces
    from kafscale.acceptor.listener import Listener
    from kafscale.security.sasl import SaslSession

__all__ = ["Decoder", "Handler", "RequestContext", "Route", "Router"]


@dataclass(slots=True)
class RequestContext:
    api_key: int
    # The version the client asked for. For an ApiVersions request newer than we support this
    # is that newer version while the request object is an empty v0 ApiVersionsRequest.
    api_version: int
    correlation_id: int
    client_id: str | None
    client_host: str
    client_port: int
    connection_id: int
    listener: Listener  # .name / .host / .port / .advertised_host of the listener that got the request
    principal: Principal = ANONYMOUS  # who the client proved to be (SASL, or an SSL client certificate)
    sasl: SaslSession | None = None  # the connection's SASL state, on SASL listeners (the SASL handlers' business)
    produce_waits: WaitingProduces | None = None  # the connection's acks=all produces that may block, not answered


# Answers a kio response object of the request's (api_key, api_version), an EncodedResponse, or None
# for "send nothing" (acks=0 produce). Raising closes the connection (see listener.py). A coroutine
# function gets a task per request; a plain function that can answer from callbacks (Produce) returns
# an asyncio.Future instead and costs no task.
Handler = Callable[[RequestContext, Any], Awaitable[Any | None]]
# (api_key, version, payload, body offset) -> request object: an API's own reader in place of kio's.
Decoder = Callable[[int, int, "bytes | memoryview", int], Any]


class Route(NamedTuple):
    min_version: int
    max_version: int
    handler: Handler
    decode: Decoder
    gets_task: bool  # a coroutine function: each request runs in a task of its own


class Router:
    def __init__(self, finalized_features: dict[str, int] | None = None) -> None:
        self.observe: Callable[[int, float], None] | None = None  # (api key, seconds) per request: metrics
        self.finalized_features = finalized_features or {}  # ApiVersions' feature levels, by name
        # Imported here: api_versions imports this module for its type hints.
        from kafscale.acceptor.handlers import api_versions

        self._routes: dict[int, Route] = {
            api_versions.API_KEY: Route(
                api_versions.MIN_VERSION,
                api_versions.MAX_VERSION,
                api_versions.api_versions_handler(self),
                decode_request,
                gets_task=True,
            )
        }

    def register(self, api_key: int, min_version: int, max_version: int, handler: Handler,
                 decode: Decoder = decode_request) -> None:
        """Serve versions min..max of api_key with handler. Every version must be one kio has
        schemas for; registering a key twice is a programming error."""
        if api_key in self._routes:
            raise ValueError(f"API key {api_key} is already registered")
        if not 0 <= min_version <= max_version:
            raise ValueError(f"bad version range {min_version}..{max_version} for API key {api_key}")
        # Fail at start-up, not on the first request, when kio lacks a version; the classes themselves load on
        # the first request of each version.
        missing = [v for v in range(min_version, max_version + 1) if not has_schemas(api_key, v)]
        if missing:
            raise ValueError(f"API key {api_key}: kio has no schemas for versions {missing}")
        self._routes[api_key] = Route(min_version, max_version, handler, decode,
                                      gets_task=_is_coroutine_function(handler))

    def supported(self) -> dict[int, tuple[int, int]]:
        """{api_key: (min_version, max_version)} for every registered API, ApiVersions included;
        exactly what ApiVersions advertises."""
        return {key: (r.min_version, r.max_version) for key, r in sorted(self._routes.items())}

    def lookup(self, api_key: int) -> Route | None:
        return self._routes.get(api_key)

    def start(self, ctx: RequestContext, request: Any) -> asyncio.Future[Any]:
        """Run the handler: a future of its answer (a handler's exception is in the future too)."""
        route = self._routes.get(ctx.api_key)
        if route is None:  # the listener checks first; this guards direct callers
            raise LookupError(f"no handler for API key {ctx.api_key}")
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        if route.gets_task:
            # The coroutine is made inside the task: a task cancelled before its first step (its
            # connection went away) then leaves no coroutine behind that was never awaited.
            return loop.create_task(self._run(route.handler, ctx, request, start))
        try:
            answer = route.handler(ctx, request)
        except Exception as e:
            answer = loop.create_future()
            answer.set_exception(e)
        if self.observe is not None:
            observe, api_key = self.observe, ctx.api_key
            answer.add_done_callback(lambda _: observe(api_key, time.perf_counter() - start))
        return answer  # type: ignore[return-value]  # a handler that is no coroutine function returns a future

    async def _run(self, handler: Handler, ctx: RequestContext, request: Any, start: float) -> Any:
        try:
            return await handler(ctx, request)
        finally:
            if self.observe is not None:
                self.observe(ctx.api_key, time.perf_counter() - start)


def _is_coroutine_function(handler: Handler) -> bool:
    """An `async def` function, or an object whose __call__ is one."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(type(handler).__call__)
