"""Request header parsing (request header v0, v1 and v2), without kio, so that the listener can
read key, version and correlation id even for APIs and versions it has no schema for.

    v0: api_key int16, api_version int16, correlation_id int32     (only ControlledShutdown v0)
    v1: v0 + client_id nullable string (int16 length, -1 = null)
    v2: v1 + tagged fields (flexible versions). client_id stays a legacy string even here.

Which header a request carries follows from (api_key, api_version): v2 from the API's first
flexible version on, as Kafka's generated `requestHeaderVersion` does. For a version newer
than any we know (a newer client's ApiVersions) the newest known version's rule applies.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from kafscale.protocol.codec import known_versions, request_class
from kafscale.protocol.errors import InvalidRequestHeader
from kafscale.protocol.varint import VarintError, read_uvarint

__all__ = ["RequestHeader", "parse_request_header", "request_header_version"]

_FIXED = struct.Struct(">hhi")
_I16 = struct.Struct(">h")


@dataclass(slots=True)  # not frozen: frozen dataclasses cost ~1 µs more to build, per request
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None  # None when the client sent a null string (Kafka treats it as "")
    header_version: int
    size: int  # bytes the header occupies; the body starts at this offset


# Only (key, version) pairs kio knows are cached, so garbage headers cannot grow it.
_header_versions: dict[tuple[int, int], int] = {}


def request_header_version(api_key: int, api_version: int) -> int:
    cached = _header_versions.get((api_key, api_version))
    if cached is not None:
        return cached
    known = known_versions(api_key)
    if known is None:
        return 1  # unknown API: only the fixed part matters, the connection is closed anyway
    lo, hi = known
    if not lo <= api_version <= hi:
        return request_header_version(api_key, min(max(api_version, lo), hi))
    version = int(request_class(api_key, api_version).__header_schema__.__version__)
    _header_versions[(api_key, api_version)] = version
    return version


def parse_request_header(payload: bytes | memoryview, offset: int = 0) -> RequestHeader:
    """Parse the header at `offset` of a frame payload (bytes, or the read-only memoryview the
    listener hands out for large frames). Raises InvalidRequestHeader when it is truncated or
    its tagged-field section is inconsistent."""
    end = len(payload)
    if end - offset < 8:
        raise InvalidRequestHeader(f"request of {end - offset} bytes is shorter than a header")
    api_key, api_version, correlation_id = _FIXED.unpack_from(payload, offset)
    header_version = request_header_version(api_key, api_version)
    pos = offset + 8
    client_id: str | None = None
    if header_version >= 1:
        if end - pos < 2:
            raise InvalidRequestHeader("truncated client id")
        length = _I16.unpack_from(payload, pos)[0]
        pos += 2
        if length >= 0:
            if end - pos < length:
                raise InvalidRequestHeader("truncated client id")
            # Java decodes with replacement characters rather than failing; so do we.
            client_id = str(payload[pos : pos + length], "utf-8", "replace")
            pos += length
        elif length != -1:
            raise InvalidRequestHeader(f"negative client id length {length}")
    if header_version >= 2:
        pos = _skip_tagged_fields(payload, pos, end)
    return RequestHeader(api_key, api_version, correlation_id, client_id, header_version, pos - offset)


def _uvarint(payload: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    try:
        return read_uvarint(payload, pos, end)
    except VarintError as e:
        raise InvalidRequestHeader(f"{e} in tagged fields") from None


def _skip_tagged_fields(payload: bytes | memoryview, pos: int, end: int) -> int:
    # Header tags (none are defined by Kafka today) are skipped by their declared size.
    count, pos = _uvarint(payload, pos, end)
    for _ in range(count):
        _, pos = _uvarint(payload, pos, end)
        size, pos = _uvarint(payload, pos, end)
        pos += size
        if pos > end:
            raise InvalidRequestHeader("tagged field runs past the end of the request")
    return pos
