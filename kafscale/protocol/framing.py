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
    "BufferPool",
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


class BufferPool:
    """Receive buffers for large frames, shared by one listener's connections (one event loop,
    so no locking). Reusing memory that is already mapped matters: with a fresh buffer per
    1 MiB frame, faulting in its pages cost more CPU than receiving into it. Sharing, rather
    than one spare per connection, keeps idle connections from each holding their largest
    request. Sizes are rounded up to a quarter-power-of-two class (at most 25% slack) so
    requests of slightly different sizes reuse the same buffers.
    """

    def __init__(self, max_idle_bytes: int = 64 * 1024 * 1024, max_buffer_bytes: int = 16 * 1024 * 1024) -> None:
        self._free: dict[int, list[bytearray]] = {}
        self._idle = 0
        self._max_idle = max_idle_bytes
        self._max_buffer = max_buffer_bytes

    @staticmethod
    def size_class(size: int) -> int:
        step = max(1 << (max(size - 1, 1).bit_length() - 1) >> 2, 4096)
        return -(-size // step) * step

    def take(self, size: int) -> bytearray:
        """A buffer of at least `size` bytes (its contents are garbage)."""
        if size > self._max_buffer:
            return bytearray(size)  # a rare giant request is not worth keeping
        cls = self.size_class(size)
        free = self._free.get(cls)
        if free:
            self._idle -= cls
            return free.pop()
        return bytearray(cls)

    def give(self, buffer: bytearray) -> None:
        cls = len(buffer)
        if cls > self._max_buffer or self._idle + cls > self._max_idle or cls != self.size_class(cls):
            return
        self._free.setdefault(cls, []).append(buffer)
        self._idle += cls

    @property
    def idle_bytes(self) -> int:
        return self._idle


class FrameAssembler:
    """The receive side for an asyncio.BufferedProtocol: the transport reads into
    `get_buffer()`, reports with `buffer_updated(n)`, and complete frame payloads come out of
    `next_frame()` one at a time (so the caller can stop taking them under back-pressure).

    Small frames are read into a scratch buffer and copied out as `bytes`. A frame larger than
    `direct_threshold` is received straight into a buffer from the BufferPool and handed out
    as a read-only memoryview, so a 1 MiB produce request is copied once, by recv. (128 KiB of
    scratch with a 32 KiB threshold measured best for pipelined 16 KiB batches; half of that
    cost a third more CPU per request, double gained nothing and every connection has one.) That
    memoryview is only valid until the next call to get_buffer(), next_frame() or close(): its
    buffer then goes back to the pool. Decode it (kio copies what it keeps) before reading on.
    """

    def __init__(
        self,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        *,
        pool: BufferPool | None = None,
        scratch_bytes: int = 128 * 1024,
        direct_threshold: int = 32 * 1024,
    ) -> None:
        if direct_threshold + 4 > scratch_bytes // 2:
            raise ValueError("direct_threshold must leave room for a small frame in the scratch buffer")
        self._max = max_frame_bytes
        self._direct = direct_threshold
        self._pool = pool if pool is not None else BufferPool()
        self._scratch = bytearray(scratch_bytes)
        self._view = memoryview(self._scratch)
        self._start = 0  # first unconsumed byte in scratch
        self._end = 0  # end of received bytes in scratch
        self._large: bytearray | None = None  # pooled buffer of a large frame being received
        self._large_view: memoryview | None = None  # exactly the frame's bytes within it
        self._filled = 0  # bytes of it received so far
        self._lent: bytearray | None = None  # buffer behind the last memoryview handed out

    def get_buffer(self) -> memoryview:
        self._return_lent()
        if self._large_view is not None:
            return self._large_view[self._filled :]
        if len(self._scratch) - self._end < self._direct:
            self._compact()
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._large_view is not None:
            self._filled += nbytes
        else:
            self._end += nbytes

    def next_frame(self) -> bytes | memoryview | None:
        """The next complete payload, or None until more bytes arrive. Raises InvalidFrameSize
        (and must then not be called again) for a size prefix out of range."""
        self._return_lent()
        if self._large_view is not None:
            if self._filled < len(self._large_view):
                return None
            return self._lend()
        available = self._end - self._start
        if available < 4:
            if available == 0:
                self._start = self._end = 0
            return None
        start = self._start
        size = check_frame_size(self._view[start : start + 4], self._max)
        if size > self._direct:
            self._large = self._pool.take(size)
            self._large_view = memoryview(self._large)[:size]
            have = min(size, available - 4)
            self._large_view[:have] = self._view[start + 4 : start + 4 + have]
            self._start += 4 + have
            self._filled = have
            return self._lend() if have == size else None
        if available - 4 < size:
            return None
        self._start += 4 + size
        return bytes(self._view[start + 4 : start + 4 + size])

    def close(self) -> None:
        """Give pooled buffers back (the connection is gone)."""
        self._return_lent()
        if self._large is not None:
            self._pool.give(self._large)
            self._large = self._large_view = None

    @property
    def buffered(self) -> int:
        """Received bytes not yet handed out (a partial frame at EOF means a truncated request)."""
        return self._end - self._start + (self._filled if self._large_view is not None else 0)

    def _lend(self) -> memoryview:
        assert self._large_view is not None
        payload = self._large_view.toreadonly()
        self._lent = self._large
        self._large = self._large_view = None
        return payload

    def _return_lent(self) -> None:
        if self._lent is not None:
            self._pool.give(self._lent)
            self._lent = None

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
