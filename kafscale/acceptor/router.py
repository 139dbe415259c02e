"""API key → handler table, and the context every handler receives."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kafscale.protocol.codec import request_class, response_class

if TYPE_CHECKING:
    from kafscale.acceptor.listener import Listener

__all__ = ["Handler", "RequestContext", "Router"]


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
    listener: Listener  # .host / .port / .advertised_host of the listener that got the request


# Returns a kio response object of the request's (api_key, api_version), or None for "send
# nothing" (acks=0 produce). Raising closes the connection (see listener.py).
Handler = Callable[[RequestContext, Any], Awaitable[Any | None]]


class Router:
    def __init__(self) -> None:
        self.observe: Callable[[int, float], None] | None = None  # (api key, seconds) per request: metrics
        # Imported here: api_versions imports this module for its type hints.
        from kafscale.acceptor.apis import api_versions

        self._routes: dict[int, tuple[int, int, Handler]] = {
            api_versions.API_KEY: (
                api_versions.MIN_VERSION,
                api_versions.MAX_VERSION,
                api_versions.api_versions_handler(self),
            )
        }

    def register(self, api_key: int, min_version: int, max_version: int, handler: Handler) -> None:
        """Serve versions min..max of api_key with handler. Every version must be one kio has
        schemas for; registering a key twice is a programming error."""
        if api_key in self._routes:
            raise ValueError(f"API key {api_key} is already registered")
        if not 0 <= min_version <= max_version:
            raise ValueError(f"bad version range {min_version}..{max_version} for API key {api_key}")
        for version in range(min_version, max_version + 1):
            # Fail at start-up, not on the first request, when kio lacks a version.
            request_class(api_key, version)
            response_class(api_key, version)
        self._routes[api_key] = (min_version, max_version, handler)

    def supported(self) -> dict[int, tuple[int, int]]:
        """{api_key: (min_version, max_version)} for every registered API, ApiVersions included;
        exactly what ApiVersions advertises."""
        return {key: (lo, hi) for key, (lo, hi, _) in sorted(self._routes.items())}

    def lookup(self, api_key: int) -> tuple[int, int, Handler] | None:
        return self._routes.get(api_key)

    async def dispatch(self, ctx: RequestContext, request: Any) -> Any | None:
        route = self._routes.get(ctx.api_key)
        if route is None:  # the listener checks first; this guards direct callers
            raise LookupError(f"no handler for API key {ctx.api_key}")
        if self.observe is None:
            return await route[2](ctx, request)
        start = time.perf_counter()
        try:
            return await route[2](ctx, request)
        finally:
            self.observe(ctx.api_key, time.perf_counter() - start)
