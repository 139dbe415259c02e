"""The bearer token an HTTP endpoint asks for, kept in a file so it never shows in a process listing.

The file is re-read when its modification time or size changes, so a token is rotated by rewriting the file.
Comparison runs in constant time. A file that cannot be read, or holds only whitespace, matches nothing.
"""

from __future__ import annotations

import hmac
import logging
import os

log = logging.getLogger(__name__)


class BearerToken:
    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[float, int] | None = None
        self._token = b""

    def _current(self) -> bytes:
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime, st.st_size)
            if stamp != self._stamp:
                with open(self.path, "rb") as f:
                    self._token = f.read().strip()
                self._stamp = stamp
                if not self._token:
                    log.warning("bearer token file %s is empty: every request is refused", self.path)
        except OSError as e:
            if self._token or self._stamp is None:
                log.warning("bearer token file %s cannot be read (%s): every request is refused", self.path, e)
            self._token, self._stamp = b"", (0.0, -1)
        return self._token

    def admits(self, authorization: str | None) -> bool:
        """True when the Authorization header is `Bearer <the token>`."""
        token = self._current()
        scheme, _, given = (authorization or "").partition(" ")
        if not token or scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(given.strip().encode(), token)
