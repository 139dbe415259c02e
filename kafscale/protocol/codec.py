"""Request decoding with kio, cached per (api_key, version), behind the length guard.

Every request body is walked by the guard (kafscale.protocol.guard) before kio's native reader
sees it; see that module for why. Schema lookup and make() live in kafscale.protocol.schemas,
encoding in kafscale.protocol.encoder; they are re-exported here, the protocol layer's one door.

kio 0.6.2 is pinned: 0.6.3+ dropped the pre-Kafka-4 versions clients still send.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, NamedTuple

from kio.serial import entity_reader

from kafscale.protocol import guard
from kafscale.protocol.encoder import encode_entity, encode_request, encode_response, readdress_response
from kafscale.protocol.errors import ErrorCode, MalformedRequest
from kafscale.protocol.guard import MAX_ELEMENTS, validate_lengths
from kafscale.protocol.schemas import convert, known_versions, make, nested, replace, request_class, response_class

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")

__all__ = [
    "MAX_ELEMENTS",
    "convert",
    "decode_request",
    "decode_response",
    "encode_entity",
    "encode_request",
    "encode_response",
    "known_versions",
    "make",
    "nested",
    "readdress_response",
    "replace",
    "request_class",
    "response_class",
    "validate_lengths",
]

class _Reader(NamedTuple):
    cls: type[Any]
    read: Callable[[bytes, int], tuple[Any, int]]


_request_readers: dict[tuple[int, int], _Reader] = {}
_response_readers: dict[tuple[int, int], _Reader] = {}


def _reader(cache: dict[tuple[int, int], _Reader], cls: type[Any]) -> _Reader:
    entry = _Reader(cls, entity_reader(cls))
    cache[(cls.__api_key__, cls.__version__)] = entry
    return entry


def _decode(entry: _Reader, api_key: int, version: int, payload: bytes | memoryview, offset: int) -> Any:
    try:
        checked = guard.check(entry.cls, payload, offset)
        value, _ = entry.read(checked, offset)
    except guard.GuardError as e:
        raise MalformedRequest(api_key, version, str(e)) from None
    except Exception as e:  # kio raises ValueError, KeyError, its DecodeError family, …
        raise MalformedRequest(api_key, version, f"{type(e).__name__}: {e}") from None
    # Trailing bytes are ignored, as Kafka does (RequestContext parses and never checks them).
    return value


def decode_request(api_key: int, version: int, payload: bytes | memoryview, offset: int) -> Any:
    """Decode the body starting at `offset` (after the header). `payload` must be read-only:
    `bytes` or a read-only memoryview (kio's reader refuses writable buffers); the result keeps
    no reference to it (records are copied into `bytes`). Raises UnknownApiKey,
    UnsupportedApiVersion or MalformedRequest; never lets garbage reach the native reader
    unchecked."""
    entry = _request_readers.get((api_key, version))
    if entry is None:
        entry = _reader(_request_readers, request_class(api_key, version))
    return _decode(entry, api_key, version, payload, offset)


def decode_response(api_key: int, version: int, payload: bytes | bytearray) -> tuple[int, Any]:
    """(correlation_id, response) from a response frame without its size prefix (client side:
    tests, tools). An ApiVersions UNSUPPORTED_VERSION answer is v0-shaped whatever version was
    asked for, as Kafka sends it."""
    if not isinstance(payload, bytes):
        payload = bytes(payload)  # kio's reader takes read-only buffers only
    correlation_id = _I32.unpack_from(payload, 0)[0]
    cls = response_class(api_key, version)
    if api_key == 18 and len(payload) >= 6 and _I16.unpack_from(payload, 4)[0] == ErrorCode.unsupported_version:
        cls = response_class(18, 0)
    offset = 4 + (1 if cls.__header_schema__.__version__ >= 1 else 0)
    entry = _response_readers.get((cls.__api_key__, cls.__version__)) or _reader(_response_readers, cls)
    return correlation_id, _decode(entry, cls.__api_key__, cls.__version__, payload, offset)


