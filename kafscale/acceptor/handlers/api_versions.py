"""ApiVersions (key 18), v0–v4: advertises exactly what the Router has registered.

Kafka's behaviour, followed here:
* A version newer than we support is not parsed; the answer is a **v0** response (v0 header)
  with UNSUPPORTED_VERSION and an api list holding only ApiVersions' own range, so the client
  retries with the highest version we have (KIP-511; ApiVersionsRequest.getErrorResponse).
* v3+ requests carry client_software_name/version; names that do not match Kafka's pattern get
  INVALID_REQUEST with an empty api list.
* v3+ responses have tagged fields (supported/finalized features, features epoch, zk migration);
  we have no features, so all keep their defaults and none is written: librdkafka 2.0 (kcat)
  fails on default-valued tags, and Kafka omits them too.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from kafscale.protocol.codec import make, nested, request_class, response_class
from kafscale.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from kafscale.acceptor.router import Handler, RequestContext, Router

__all__ = ["API_KEY", "MAX_VERSION", "MIN_VERSION", "UNSUPPORTED_VERSION_REQUEST", "api_versions_handler"]

API_KEY = 18
MIN_VERSION = 0
MAX_VERSION = 4

# What the listener dispatches for an ApiVersions request whose version we do not support:
# Kafka does not parse such a body either, it treats the request as an empty v0 request.
UNSUPPORTED_VERSION_REQUEST: Any = request_class(API_KEY, 0)()

# Kafka's ApiVersionsRequest.SOFTWARE_NAME_VERSION_PATTERN
_SOFTWARE = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")


def api_versions_handler(router: Router) -> Handler:
    """The handler the Router installs for itself (it answers from router.supported())."""

    async def handle(ctx: RequestContext, request: Any) -> Any:
        version = ctx.api_version
        if not MIN_VERSION <= version <= MAX_VERSION:
            return _response(0, ErrorCode.unsupported_version, {API_KEY: (MIN_VERSION, MAX_VERSION)})
        if version >= 3 and not (
            _SOFTWARE.fullmatch(request.client_software_name)
            and _SOFTWARE.fullmatch(request.client_software_version)
        ):
            return _response(version, ErrorCode.invalid_request, {})
        return _response(version, ErrorCode.none, router.supported())

    return handle


def _response(version: int, error: ErrorCode, apis: dict[int, tuple[int, int]]) -> Any:
    cls = response_class(API_KEY, version)
    entry = nested(cls, "ApiVersion")
    return make(
        cls,
        error_code=error,
        api_keys=tuple(
            entry(api_key=key, min_version=lo, max_version=hi) for key, (lo, hi) in sorted(apis.items())
        ),
        throttle_time=0,
    )
