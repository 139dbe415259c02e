"""Console sessions: a random id in an HttpOnly cookie, a CSRF token per session, an expiry, a logout.

A session lives only in this process: a restarted console asks everyone to log in again, which for one
operator's page is cheaper than keeping sessions in the metadata store. Their number is bounded; past the
bound the oldest is closed.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

COOKIE = "kafscale_console"
CSRF_HEADER = "X-CSRF-Token"
DEFAULT_TTL_S = 8 * 3600.0
MAX_SESSIONS = 1000


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    username: str
    csrf: str
    expires_at: float

    def csrf_matches(self, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(token.encode(), self.csrf.encode())


class Sessions:
    def __init__(self, ttl_s: float = DEFAULT_TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._open: dict[str, Session] = {}  # in order of opening

    def open(self, username: str) -> Session:
        session = Session(secrets.token_urlsafe(32), username, secrets.token_urlsafe(32), self._clock() + self.ttl_s)
        self._open[session.id] = session
        while len(self._open) > MAX_SESSIONS:
            del self._open[next(iter(self._open))]
        return session

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        session = self._open.get(session_id)
        if session is not None and session.expires_at <= self._clock():
            del self._open[session_id]
            return None
        return session

    def close(self, session_id: str) -> None:
        self._open.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._open)
