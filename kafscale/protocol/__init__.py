"""The Kafka wire protocol without I/O: framing, request headers, kio-based body codec, errors."""

from kafscale.protocol.codec import (
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    known_versions,
    make,
    nested,
    request_class,
    response_class,
)
from kafscale.protocol.errors import (
    ErrorCode,
    InvalidFrameSize,
    InvalidRequestHeader,
    MalformedRequest,
    ProtocolError,
    UnknownApiKey,
    UnsupportedApiVersion,
)
from kafscale.protocol.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    BufferPool,
    FrameAssembler,
    FrameBuffer,
    check_frame_size,
    frame,
)
from kafscale.protocol.header import RequestHeader, parse_request_header

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "BufferPool",
    "ErrorCode",
    "FrameAssembler",
    "FrameBuffer",
    "InvalidFrameSize",
    "InvalidRequestHeader",
    "MalformedRequest",
    "ProtocolError",
    "RequestHeader",
    "UnknownApiKey",
    "UnsupportedApiVersion",
    "check_frame_size",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "frame",
    "known_versions",
    "make",
    "nested",
    "parse_request_header",
    "request_class",
    "response_class",
]
