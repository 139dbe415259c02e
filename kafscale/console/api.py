"""The console's HTTP API and its page.

Every /api/ route but /api/session and /api/login needs a session cookie; every one that changes something
(any method but GET) also needs the session's CSRF token in the X-CSRF-Token header, so another site's form or
script cannot act with the operator's cookie. Answers are JSON; a failure is `{"error": "..."}` with a 4xx/5xx
status, naming what was wrong. Deleting asks for the name again (`?confirm=NAME`): a slip of the mouse deletes
nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from kafscale.console import group_routes, placement_routes, security_routes, topic_routes
from kafscale.console import http_io as io
from kafscale.console.credentials import LoginPolicy
from kafscale.console.sessions import COOKIE, CSRF_HEADER, Session, Sessions
from kafscale.console.view import ClusterView, ConsoleError
from kafscale.security.throttle import FailureThrottle

log = logging.getLogger(__name__)

STATIC = Path(__file__).with_name("static")
MAX_BODY = 1024 * 1024
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
OPEN_ROUTES = {"/api/session", "/api/login"}
MAX_LOGINS_IN_FLIGHT = 16
SESSION = web.RequestKey("session", Session)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ConsoleApi:
    def __init__(self, view: ClusterView, policy: LoginPolicy, *, secure_cookies: bool,
                 sessions: Sessions | None = None, throttle: FailureThrottle | None = None,
                 links: dict[str, str] | None = None) -> None:
        self.view = view
        self.policy = policy
        self.secure_cookies = secure_cookies
        self.sessions = sessions or Sessions()
        self.throttle = throttle or FailureThrottle()
        self.links = links or {}  # e.g. the Ray dashboard's address, for the page's links
        # One login at a time per address, and few at all: the slowdown of failures would mean little to a guesser
        # who sends many in parallel.
        self._logging_in: set[str] = set()

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=MAX_BODY)
        r = app.router
        r.add_get("/", self._index)
        r.add_static("/static/", STATIC, show_index=False)
        r.add_get("/api/session", self._session)
        r.add_post("/api/login", self._login)
        r.add_post("/api/logout", self._logout)
        r.add_get("/api/overview", self._overview)
        for page in (topic_routes, group_routes, security_routes, placement_routes):
            r.add_routes(page.routes(self.view))
        return app

    # ---------------------------------------------------------------- the guard

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            if request.path.startswith("/api/") and request.path not in OPEN_ROUTES:
                session = self.sessions.get(request.cookies.get(COOKIE))
                if session is None:
                    raise ConsoleError(401, "not logged in, or the session expired: log in again")
                if request.method != "GET" and not session.csrf_matches(request.headers.get(CSRF_HEADER)):
                    log.warning("console: refused %s %s from %s: missing or wrong CSRF token", request.method,
                                request.path, request.remote)
                    raise ConsoleError(403, "missing or wrong CSRF token: reload the page")
                request[SESSION] = session
            response = await handler(request)
        except ConsoleError as e:
            response = io.error(e.status, e.message)
        except web.HTTPRequestEntityTooLarge:
            response = io.error(413, f"the request body is larger than {MAX_BODY} bytes")
        except web.HTTPException as e:
            if e.status >= 400:
                response = io.error(e.status, e.reason)
            else:
                raise
        except Exception:
            log.exception("console: %s %s failed", request.method, request.path)
            response = io.error(500, "internal error: see the broker's log")
        response.headers.update(SECURITY_HEADERS)
        return response

    # ---------------------------------------------------------------- login

    async def _index(self, _request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "index.html")

    async def _session(self, request: web.Request) -> web.Response:
        session = self.sessions.get(request.cookies.get(COOKIE))
        return io.answer({"logged_in": session is not None, "username": session.username if session else None,
                      "csrf": session.csrf if session else None,
                      "login_disabled": self.policy.disabled_reason or None, "links": self.links})

    async def _login(self, request: web.Request) -> web.Response:
        if self.policy.credentials is None:
            raise ConsoleError(403, self.policy.disabled_reason)
        body = await io.body(request, "username", "password")
        username, password = body.get("username"), body.get("password")
        if not isinstance(username, str) or not isinstance(password, str):
            raise ConsoleError(400, "username and password: expected two strings")
        address = request.remote or ""
        if address in self._logging_in or len(self._logging_in) >= MAX_LOGINS_IN_FLIGHT:
            raise ConsoleError(429, "another login is in progress: wait for its answer")
        self._logging_in.add(address)
        try:
            if not self.policy.admits(username, password):
                delay = self.throttle.failed(address)
                log.warning("console: failed login for %r from %s (%d failed so far)", username, address,
                            self.throttle.total)
                await asyncio.sleep(delay)
                raise ConsoleError(401, "wrong username or password")
        finally:
            self._logging_in.discard(address)
        session = self.sessions.open(username)
        log.info("console: %r logged in from %s", username, request.remote)
        response = io.answer({"logged_in": True, "username": username, "csrf": session.csrf})
        self._set_cookie(response, session)
        return response

    def _set_cookie(self, response: web.Response, session: Session) -> None:
        response.set_cookie(COOKIE, session.id, max_age=int(self.sessions.ttl_s), path="/", httponly=True,
                            samesite="Strict", secure=self.secure_cookies)

    async def _logout(self, request: web.Request) -> web.Response:
        self.sessions.close(request[SESSION].id)
        response = io.answer({"logged_in": False})
        response.del_cookie(COOKIE, path="/")
        return response

    async def _overview(self, _request: web.Request) -> web.Response:
        return io.answer(await self.view.overview())
