"""Writing large files with O_DIRECT, past the page cache.

A buffered write() copies every byte into freshly allocated page-cache pages, and with several threads
writing 4 MiB segments at once that copy cost a shard 1-3 ms of CPU per MiB (half of its CPU at
240 MiB/s, `docs/performance.md`). With O_DIRECT the disk reads the bytes straight from our buffer:
0.5 ms per MiB, including the one copy into an aligned buffer that O_DIRECT needs. Nothing is lost
for readers: the broker serves recent segments from its own cache, and older ones were evicted from
the page cache long before anyone read them again.

O_DIRECT wants the buffer address, the length and the file offset aligned to the device's block size;
4,096 bytes satisfies every common device. The last piece is padded up to the alignment and the file is
then truncated to its real length (the caller fsyncs after, which makes the length durable too).
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import threading

ALIGN = 4096
PIECE_BYTES = 1024 * 1024  # per-thread aligned buffer: 1 MiB pieces measured as fast as 4 MiB ones
MIN_BYTES = 256 * 1024  # below this the page-cache copy costs less than the extra syscalls
O_DIRECT: int = getattr(os, "O_DIRECT", 0)  # 0 where the platform has none (macOS)


class DirectIORefused(OSError):
    """The filesystem took the O_DIRECT open but refused the first write; direct writes are now off."""


class DirectWriter:
    """Writes a whole file through an aligned per-thread buffer. Switches itself off for good the first
    time the filesystem refuses O_DIRECT (tmpfs before Linux 6.6, some FUSE and network filesystems),
    which shows as EINVAL on the open or on the first write."""

    def __init__(self) -> None:
        self.enabled = O_DIRECT != 0
        self._local = threading.local()

    def wants(self, size: int) -> bool:
        return self.enabled and size >= MIN_BYTES

    def refused(self, exc: OSError) -> bool:
        """For an error of the O_DIRECT open: True (and direct writes are off from now on) when it
        says the filesystem cannot do them."""
        if exc.errno == errno.EINVAL:
            self.enabled = False
            return True
        return False

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> None:
        """Write data to fd, which was opened with O_DIRECT at offset 0. Raises DirectIORefused when the
        first write is refused; the caller writes the file again, buffered."""
        buf = self._buffer()
        src = memoryview(data).cast("B")
        size = len(src)
        direct, first = True, True
        for start in range(0, size, PIECE_BYTES):
            piece = src[start : start + PIECE_BYTES]
            n = len(piece)
            buf[:n] = piece
            out = buf[: -(-n // ALIGN) * ALIGN] if direct else buf[:n]
            while out:
                try:
                    written = os.write(fd, out)
                except OSError as exc:
                    if first and self.refused(exc):
                        raise DirectIORefused(exc.errno, f"O_DIRECT write refused: {exc.strerror}") from exc
                    raise
                first = False
                out = out[written:]
                if out and direct and written % ALIGN:
                    # A short write that ends off a block boundary (the kernel does not promise
                    # otherwise): finish this file buffered, unaligned writes being fine there.
                    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~O_DIRECT)
                    direct = False
        if size % ALIGN:
            os.ftruncate(fd, size)

    def _buffer(self) -> memoryview:
        view: memoryview | None = getattr(self._local, "view", None)
        if view is None:
            view = memoryview(mmap.mmap(-1, PIECE_BYTES))  # anonymous mappings are page-aligned
            self._local.view = view
        return view
