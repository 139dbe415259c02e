"""How the local object store makes bytes durable files: fsynced temporary files renamed or linked into place,
unnamed files (O_TMPFILE) linked by their descriptor, O_DIRECT for large objects, directory fsyncs.

Several processes may share one directory (Ray workers), so atomicity comes from the filesystem's own
primitives (rename, link), never from in-process locks; kafscale.storage.local_store builds the object
store's semantics on these.
"""

from __future__ import annotations

import contextlib
import os
import stat
import uuid
from pathlib import Path

from kafscale.storage.direct_io import O_DIRECT, DirectIORefused, DirectWriter

# Temporary files carry this prefix; listings skip them and keys may not use it.
TEMP_PREFIX = ".kfs-tmp-"

# A writer's mkdir can race other processes' deletes that remove the emptied parents again.
MKDIR_RACE_ATTEMPTS = 20

_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


class DurableFiles:
    """Writes of new files, each fsynced before it is returned."""

    def __init__(self, direct: DirectWriter) -> None:
        self.direct = direct

    def temp_file(self, path: Path, data: bytes) -> Path:
        """Durably write data to a fresh temporary file next to path and return its name."""
        races = 0
        while True:
            tmp = path.parent / f"{TEMP_PREFIX}{uuid.uuid4().hex}"
            direct = self.direct.wants(len(data))
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(tmp, _CREATE_FLAGS | (O_DIRECT if direct else 0), 0o644)
            except (FileNotFoundError, FileExistsError):
                # A concurrent delete pruned a parent directory during our mkdir (which then reports
                # "exists" for a directory that is gone) or between mkdir and open. FileExistsError
                # also means a file is in the way; that persists and is raised after the retries.
                races += 1
                if races == MKDIR_RACE_ATTEMPTS:
                    raise
                continue
            except OSError as exc:
                if direct and self.direct.refused(exc):
                    continue  # this filesystem has no O_DIRECT: buffered from now on
                raise
            try:
                self._fill(fd, data, direct)
            except BaseException as exc:
                os.close(fd)
                unlink_quietly(tmp)
                if isinstance(exc, DirectIORefused):
                    continue  # refused at its first write: buffered from now on
                raise
            os.close(fd)
            return tmp

    def _fill(self, fd: int, data: bytes, direct: bool) -> None:
        if direct:
            self.direct.write(fd, data)
        else:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        os.fsync(fd)

    def unnamed_file(self, dir_fd: int, data: bytes) -> int:
        """data in a new unnamed file of the directory, fsynced; returns its open descriptor."""
        while True:
            direct = self.direct.wants(len(data))
            flags = os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC | (O_DIRECT if direct else 0)
            try:
                fd = os.open(".", flags, 0o644, dir_fd=dir_fd)
            except OSError as exc:
                if direct and self.direct.refused(exc):
                    continue
                raise
            try:
                self._fill(fd, data, direct)
            except BaseException as exc:
                os.close(fd)
                if isinstance(exc, DirectIORefused):
                    continue  # refused at its first write: buffered from now on
                raise
            return fd


def can_link_unnamed(directory: Path) -> bool:
    """Whether new objects can start as unnamed files here: O_TMPFILE (Linux, most local filesystems) and
    /proc to link them by. A creation under a temporary name costs the directory two more updates."""
    if not hasattr(os, "O_TMPFILE"):
        return False
    probe = f"{TEMP_PREFIX}probe-{uuid.uuid4().hex}"
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fd = os.open(".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        try:  # a link() through /proc must follow the link: only linkat does, hence the dir_fd
            os.link(f"/proc/self/fd/{fd}", probe, dst_dir_fd=dir_fd)
        finally:
            os.close(fd)
        os.unlink(probe, dir_fd=dir_fd)
    except OSError:
        return False
    finally:
        os.close(dir_fd)
    return True


def is_regular(mode: int) -> bool:
    return stat.S_ISREG(mode)


def unlink_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def fsync_dir(directory: Path) -> None:
    """Make a rename or link in directory durable across a power loss."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # another process already deleted the new object and pruned its directory
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
