"""ObjectStore on a local directory: the embedded default, with the same key layout as S3.

Key "a/b/c" lives at root/a/b/c. Several processes (Ray workers) may share one directory, so every
mutation is made atomic with the filesystem's own primitives instead of in-process locks:

* put: write a temporary file in the target directory, fsync it, rename it over the key.
* put_if_absent: write and fsync an unnamed file (O_TMPFILE; a temporary name where that is missing),
  then hard-link it to the key; link() refuses to replace an existing name, which makes it a
  create-if-absent that is atomic across processes. put_all_if_absent does several at once, with one
  fsync of their directory (a segment and its index).
* objects of 256 KiB and more are written with O_DIRECT, past the page cache (direct_io.py).

Unlike S3, a key cannot also be a directory: "a/b" and "a/b/c" cannot both exist. Kafscale's key
layout never needs that; attempting it raises ObjectStoreError.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

from kafscale.storage.direct_io import DirectWriter
from kafscale.storage.local_files import (
    MKDIR_RACE_ATTEMPTS,
    TEMP_PREFIX,
    DurableFiles,
    can_link_unnamed,
    fsync_dir,
    is_regular,
    unlink_quietly,
)
from kafscale.storage.object_store import ObjectInfo, ObjectNotFoundError, ObjectStore, ObjectStoreError, Volume


class LocalDirStore(ObjectStore):
    puts_together = True

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).absolute()
        self.root.mkdir(parents=True, exist_ok=True)
        self._files = DurableFiles(DirectWriter())  # large objects skip the page cache (direct_io.py)
        self._unnamed = can_link_unnamed(self.root)

    def __repr__(self) -> str:
        return f"LocalDirStore({str(self.root)!r})"

    # -- keys -------------------------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        """Validate key and map it under root; anything that could leave the root is refused."""
        if not isinstance(key, str) or not key:
            raise ValueError(f"invalid object key {key!r}: must be a non-empty string")
        if key.startswith("/") or key.endswith("/"):
            raise ValueError(f"invalid object key {key!r}: must not start or end with '/'")
        if "\0" in key:
            raise ValueError(f"invalid object key {key!r}: contains NUL")
        parts = key.split("/")
        for part in parts:
            if part in ("", ".", ".."):
                raise ValueError(f"invalid object key {key!r}: empty, '.' or '..' path component")
            if part.startswith(TEMP_PREFIX):
                raise ValueError(f"invalid object key {key!r}: {TEMP_PREFIX!r} is reserved")
        return self.root.joinpath(*parts)

    def _fail(self, op: str, key: str, exc: OSError) -> ObjectStoreError:
        return ObjectStoreError(f"local {op} of {key!r} under {self.root} failed: {exc}")

    # -- writes -----------------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        try:
            tmp = self._files.temp_file(path, data)
            try:
                os.replace(tmp, path)
            except BaseException:
                unlink_quietly(tmp)
                raise
            fsync_dir(path.parent)
        except OSError as exc:
            raise self._fail("put", key, exc) from exc

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self.put_all_if_absent([(key, data)])[0]

    def put_all_if_absent(self, items: Sequence[tuple[str, bytes]]) -> list[bool]:
        """Conditional creates; the objects of one directory share its fsync (a segment and its index).

        Each object is written to an unnamed file (O_TMPFILE) and fsynced, then linked to its key, which
        fails if the key exists; a temporary name is the fallback where O_TMPFILE or /proc is missing.
        """
        placed = [False] * len(items)
        groups: dict[Path, list[tuple[int, str, Path, bytes]]] = {}
        for i, (key, data) in enumerate(items):
            path = self._path(key)
            groups.setdefault(path.parent, []).append((i, key, path, data))
        for directory, group in groups.items():
            key = group[0][1]
            try:
                for attempt in range(1, MKDIR_RACE_ATTEMPTS + 1):
                    try:
                        self._put_group(directory, group, placed)
                        break
                    except (FileNotFoundError, FileExistsError):
                        # A concurrent delete pruned the directory (it looks empty while our files are
                        # unnamed), or a parent during our mkdir, which then reports "exists" for a
                        # directory that is gone: make it again. Objects linked before that stay placed
                        # (the retry skips them as present). A file in the way of the directory
                        # persists and is raised after the retries.
                        if attempt == MKDIR_RACE_ATTEMPTS:
                            raise
            except OSError as exc:
                raise self._fail("put_if_absent", key, exc) from exc
        return placed

    def _put_group(self, directory: Path, group: list[tuple[int, str, Path, bytes]], placed: list[bool]) -> None:
        todo = [(i, path, data) for i, key, path, data in group if not self._exists(key, path)]
        if not todo:  # the cheap early exit; the link() below is what decides
            return
        directory.mkdir(parents=True, exist_ok=True)
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        staged: list[tuple[int, Path, int | Path]] = []
        try:
            for i, path, data in todo:
                staged.append((i, path, self._files.unnamed_file(dir_fd, data) if self._unnamed
                               else self._files.temp_file(path, data)))
            linked = False
            for i, path, file in staged:
                try:
                    if isinstance(file, int):  # linkat(AT_SYMLINK_FOLLOW) of the /proc link names the file
                        os.link(f"/proc/self/fd/{file}", path.name, dst_dir_fd=dir_fd)
                    else:
                        os.link(file, path)
                except FileExistsError:
                    continue
                placed[i] = linked = True
            if linked:
                os.fsync(dir_fd)
        except OSError as exc:
            if not isinstance(exc, FileNotFoundError) and os.fstat(dir_fd).st_nlink == 0:
                # The directory was removed under us; files cannot be made in it (ext4 says EPERM or
                # ENOENT): the caller makes it again.
                raise FileNotFoundError(exc.errno, exc.strerror, str(directory)) from exc
            raise
        finally:
            for _, _, file in staged:
                if isinstance(file, int):
                    os.close(file)
                else:
                    unlink_quietly(file)
            os.close(dir_fd)

    def _exists(self, key: str, path: Path) -> bool:
        try:
            st = path.lstat()
        except (FileNotFoundError, NotADirectoryError):
            return False
        if not is_regular(st.st_mode):
            raise ObjectStoreError(f"local key {key!r} under {self.root} is a directory of other keys")
        return True

    # -- reads ------------------------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                return f.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFoundError(key) from None
        except OSError as exc:
            raise self._fail("get", key, exc) from exc

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise ValueError(f"invalid range for {key!r}: start={start} length={length}")
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                f.seek(start)
                return f.read(length)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFoundError(key) from None
        except OSError as exc:
            raise self._fail("get_range", key, exc) from exc

    def volume(self, prefix: str) -> Volume:
        try:
            disk = shutil.disk_usage(self.root)
        except OSError:
            return Volume(str(self.root / prefix))
        return Volume(str(self.root / prefix), disk.total, disk.free)

    def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise self._fail("head", key, exc) from exc
        if not is_regular(st.st_mode):
            return None
        return ObjectInfo(key, st.st_size, st.st_mtime)

    def list(self, prefix: str, start_after: str = "", page_size: int = 1000) -> Iterator[ObjectInfo]:
        if page_size < 1:
            raise ValueError(f"page_size must be positive, got {page_size}")
        # Each page is a fresh walk resuming after the last key returned, like S3's StartAfter: no
        # directory handle stays open between pages, so concurrent writers and deletes are tolerated.
        cursor = start_after
        while True:
            page = self._list_page(prefix, cursor, page_size)
            yield from page
            if len(page) < page_size:
                return
            cursor = page[-1].key

    def _list_page(self, prefix: str, start_after: str, limit: int) -> list[ObjectInfo]:
        # Begin in the deepest directory that the prefix names completely.
        dir_part, _, _ = prefix.rpartition("/")
        base = self.root
        if dir_part:
            parts = dir_part.split("/")
            if any(p in ("", ".", "..") for p in parts):
                return []  # no valid key can match such a prefix
            base = self.root.joinpath(*parts)
            dir_part += "/"
        out: list[ObjectInfo] = []
        try:
            self._walk(base, dir_part, prefix, start_after, limit, out)
        except OSError as exc:
            msg = f"local list of prefix {prefix!r} under {self.root} failed: {exc}"
            raise ObjectStoreError(msg) from exc
        return out

    def _walk(
        self,
        directory: Path,
        key_prefix: str,
        prefix: str,
        start_after: str,
        limit: int,
        out: list[ObjectInfo],
    ) -> None:
        """Append objects under directory (whose keys start with key_prefix) in byte order of key.

        Sorting a directory's entries by name, with "/" appended to subdirectory names, gives the
        byte order of the full keys: every key below subdirectory "b" starts with "b/".
        """
        try:
            with os.scandir(directory) as it:
                entries = []
                for e in it:
                    if e.name.startswith(TEMP_PREFIX):
                        continue
                    try:
                        is_dir = e.is_dir(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    entries.append((e.name + "/" if is_dir else e.name, is_dir, e))
        except (FileNotFoundError, NotADirectoryError):
            return  # a concurrent delete pruned it, or the prefix names a file's "directory"
        entries.sort(key=lambda t: t[0])
        for sort_name, is_dir, entry in entries:
            if len(out) >= limit:
                return
            key = key_prefix + sort_name
            if is_dir:
                # key is the subtree's common prefix "…/name/".
                if not (key.startswith(prefix) or prefix.startswith(key)):
                    continue
                if start_after >= key and not start_after.startswith(key):
                    continue  # the whole subtree sorts at or before start_after
                self._walk(Path(entry.path), key, prefix, start_after, limit, out)
            else:
                if key <= start_after or not key.startswith(prefix):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # deleted since the scan
                if is_regular(st.st_mode):
                    out.append(ObjectInfo(key, st.st_size, st.st_mtime))

    # -- deletes ----------------------------------------------------------------------------------

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            os.unlink(path)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return
        except OSError as exc:
            raise self._fail("delete", key, exc) from exc
        self._prune_empty_parents(path.parent)

    def _prune_empty_parents(self, directory: Path) -> None:
        """Remove directories left empty, up to but never including the root.

        Racing writers may create a file in a directory just as it is pruned; rmdir() refuses
        non-empty directories, and writers retry their mkdir, so both sides stay correct.
        """
        while directory != self.root and self.root in directory.parents:
            try:
                os.rmdir(directory)
            except OSError:
                return  # not empty, already gone, or busy: stop pruning
            directory = directory.parent
