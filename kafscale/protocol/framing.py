"""Kafka's framing: every request and response is a 4-byte big-endian signed size, then that
many bytes. Sans-I/O helpers shared by the acceptor and by test/benchmark clients.
"""

from __future__ import annotations

import struct

from kafscale.protocol.errors import InvalidFrameSize

__all__ = ["DEFAULT_MAX_FRAME_BYTES", "SIZE_PREFIX", "FrameBuffer", "check_frame_size", "frame"]

DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes default
SIZE_PREFIX = struct.Struct(">i")


def check_frame_size(prefix: bytes, max_frame_bytes: int) -> int:
    """The size in a 4-byte prefix; raises InvalidFrameSize when negative or above the limit,
    before anything is allocated for it (Kafka's NetworkReceive does the same check)."""
    size: int = SIZE_PREFIX.unpack(prefix)[0]
    if size < 0 or size > max_frame_bytes:
        raise InvalidFrameSize(size, max_frame_bytes)
    return size


def frame(payload: bytes) -> bytes:
    return SIZE_PREFIX.pack(len(payload)) + payload


class FrameBuffer:
    """Accumulates received bytes and hands out complete frame payloads (without the prefix)."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self._max = max_frame_bytes

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        frames: list[bytes] = []
        pos = 0
        buf = self._buf
        while len(buf) - pos >= 4:
            size = check_frame_size(bytes(buf[pos : pos + 4]), self._max)
            if len(buf) - pos - 4 < size:
                break
            frames.append(bytes(buf[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        if pos:
            del buf[:pos]
        return frames

    @property
    def buffered(self) -> int:
        return len(self._buf)
