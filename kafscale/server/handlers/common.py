"""What every API handler shares: the response classes of the request's version, time conversions."""

from __future__ import annotations

import datetime
import functools
import sys
from types import ModuleType

from kio.index import load_response_schema

from kafscale.protocol.codec import make
from kafscale.server.router import RequestContext

__all__ = ["NO_THROTTLE", "from_datetime", "make", "ms", "response_module", "to_datetime"]

NO_THROTTLE = datetime.timedelta(0)


@functools.cache
def _module(api_key: int, version: int) -> ModuleType:
    return sys.modules[load_response_schema(api_key, version).__module__]


def response_module(ctx: RequestContext) -> ModuleType:
    """The kio module of this request's response version (its nested classes differ per version)."""
    return _module(ctx.api_key, ctx.api_version)


def ms(value: datetime.timedelta | int | None, default: int = 0) -> int:
    if value is None:
        return default
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    return int(value)


def to_datetime(timestamp_ms: int) -> datetime.datetime | None:
    if timestamp_ms < 0:
        return None
    return datetime.datetime.fromtimestamp(timestamp_ms / 1000, tz=datetime.UTC)


def from_datetime(value: datetime.datetime | int | None) -> int:
    if value is None:
        return -1
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    return int(value)
