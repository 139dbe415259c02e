"""ApiVersions: what the proxy translates, in the versions both it and the upstream speak. A version the proxy
does not know is answered as Kafka does, in v0 with UNSUPPORTED_VERSION and ApiVersions' own range."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.protocol.codec import make, nested, response_class
from kafscale.proxy.state import Call

API_KEY, MIN_VERSION, MAX_VERSION = 18, 0, 3


def answer(version: int, error: ErrorCode, apis: dict[int, tuple[int, int]]) -> Any:
    cls = response_class(API_KEY, version)
    entry = nested(cls, "ApiVersion")
    return make(cls, error_code=error, throttle_time=0, api_keys=tuple(
        entry(api_key=key, min_version=lo, max_version=hi) for key, (lo, hi) in sorted(apis.items())))


def handler(ours: dict[int, tuple[int, int]]) -> Any:
    async def handle(call: Call, request: Any) -> Any:
        upstream = await call.session.versions()
        apis = {}
        for key, (lo, hi) in ours.items():
            up_lo, up_hi = upstream.get(key, (lo, hi) if key == API_KEY else (1, 0))
            if max(lo, up_lo) <= min(hi, up_hi):
                apis[key] = (max(lo, up_lo), min(hi, up_hi))
        return answer(request.__version__, ErrorCode.none, apis)

    return handle
