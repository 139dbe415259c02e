"""Kafka's framing: every request and response is a 4-byte big-endian signed size, then that
many bytes. Sans-I/O helpers: FrameAssembler for the broker's receive path, FrameBuffer for
test and benchmark clients.
"""

from __future__ import annotations

import struct

from kafscale.protocol.errors import InvalidFrameSize

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "SIZE_PREFIX",
    "FrameAssembler",
    "FrameBuffer",
    "check_frame_size",
    "frame",
]

DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes default
SIZE_PREFIX = struct.Struct(">i")


def check_frame_size(prefix: bytes | memoryview, max_frame_bytes: int) -> int:
    """The size in a 4-byte prefix; raises InvalidFrameSize when negative or above the limit,
    before anything is allocated for it (Kafka's NetworkReceive does the same check)."""
    size: int = SIZE_PREFIX.unpack(prefix)[0]
    if size < 0 or size > max_frame_bytes:
        raise InvalidFrameSize(size, max_frame_bytes)
    return size


def frame(payload: bytes) -> bytes:
    return SIZE_PREFIX.pack(len(payload)) + payload


class FrameAssembler:
    """The receive side for an asyncio.BufferedProtocol: the transport reads into
    `get_buffer()`, reports with `buffer_updated(n)`, and complete frame payloads come out of
    `next_frame()` one at a time (so the caller can stop taking them under back-pressure).

    Small frames are read into one reusable scratch buffer and copied out as `bytes`. A frame
    larger than `direct_threshold` is received straight into a second buffer, reused from one
    large frame to the next (up to `reuse_limit` bytes), and handed out as a read-only
    memoryview. So a 1 MiB produce request is copied once, by recv, into memory that is already
    mapped: with a fresh buffer per frame (or a growing stream buffer), faulting in new pages
    cost more CPU than the copy itself.

    A memoryview from next_frame() is only valid until the next call to get_buffer() or
    next_frame(): decode it (kio copies what it keeps) before reading on.
    """

    def __init__(
        self,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        *,
        scratch_bytes: int = 256 * 1024,
        direct_threshold: int = 64 * 1024,
        reuse_limit: int = 16 * 1024 * 1024,
    ) -> None:
        if direct_threshold + 4 > scratch_bytes // 2:
            raise ValueError("direct_threshold must leave room for a small frame in the scratch buffer")
        self._max = max_frame_bytes
        self._direct = direct_threshold
        self._scratch = bytearray(scratch_bytes)
        self._view = memoryview(self._scratch)
        self._start = 0  # first unconsumed byte in scratch
        self._end = 0  # end of received bytes in scratch
        self._large: memoryview | None = None  # a large frame being received
        self._filled = 0  # bytes of it received so far
        self._reuse_limit = reuse_limit
        self._spare: bytearray | None = None  # the buffer large frames are received into

    def get_buffer(self) -> memoryview:
        if self._large is not None:
            return self._large[self._filled :]
        if len(self._scratch) - self._end < self._direct:
            self._compact()
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._large is not None:
            self._filled += nbytes
        else:
            self._end += nbytes

    def next_frame(self) -> bytes | memoryview | None:
        """The next complete payload, or None until more bytes arrive. Raises InvalidFrameSize
        (and must then not be called again) for a size prefix out of range."""
        if self._large is not None:
            if self._filled < len(self._large):
                return None
            payload = self._large.toreadonly()
            self._large = None
            return payload
        available = self._end - self._start
        if available < 4:
            if available == 0:
                self._start = self._end = 0
            return None
        start = self._start
        size = check_frame_size(self._view[start : start + 4], self._max)
        if size > self._direct:
            large = self._large_buffer(size)
            have = min(size, available - 4)
            large[:have] = self._view[start + 4 : start + 4 + have]
            self._start += 4 + have
            if have == size:
                return large.toreadonly()
            self._large = large
            self._filled = have
            return None
        if available - 4 < size:
            return None
        self._start += 4 + size
        return bytes(self._view[start + 4 : start + 4 + size])

    def _large_buffer(self, size: int) -> memoryview:
        spare = self._spare
        if spare is None or len(spare) < size:
            spare = bytearray(size)
            if size > self._reuse_limit:
                return memoryview(spare)  # rare giant request: not kept for the connection's life
            self._spare = spare
        return memoryview(spare)[:size]

    @property
    def buffered(self) -> int:
        """Received bytes not yet handed out (a partial frame at EOF means a truncated request)."""
        return self._end - self._start + (self._filled if self._large is not None else 0)

    def _compact(self) -> None:
        remaining = self._end - self._start
        if self._start == 0 and remaining:
            # Full of complete frames the caller has not taken yet: grow rather than refuse.
            grown = bytearray(2 * len(self._scratch))
            grown[:remaining] = self._view[:remaining]
            self._scratch = grown
            self._view = memoryview(grown)
            return
        # The tail is short (at most one partial small frame), so copying it is cheap.
        self._scratch[:remaining] = bytes(self._view[self._start : self._end])
        self._start, self._end = 0, remaining


class FrameBuffer:
    """Accumulates received bytes and hands out complete frame payloads (client side)."""

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
