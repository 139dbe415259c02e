"""The console's HTTP API and its page.

Every /api/ route but /api/session and /api/login needs a session cookie; every one that changes something
(any method but GET) also needs the session's CSRF token in the X-CSRF-Token header, so another site's form or
script cannot act with the operator's cookie. Answers are JSON; a failure is `{"error": "..."}` with a 4xx/5xx
status, naming what was wrong. Deleting asks for the name again (`?confirm=NAME`): a slip of the mouse deletes
nothing.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import json
import logging
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from kafscale.console.credentials import LoginPolicy
from kafscale.console.sessions import COOKIE, CSRF_HEADER, Session, Sessions
from kafscale.console.view import ClusterView, ConsoleError
from kafscale.security.throttle import FailureThrottle

log = logging.getLogger(__name__)

STATIC = Path(__file__).with_name("static")
MAX_BODY = 1024 * 1024
MAX_PAGE = 500
TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
OPEN_ROUTES = {"/api/session", "/api/login"}
SESSION = web.RequestKey("session", Session)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status,
                             dumps=lambda o: json.dumps(o, default=lambda x: dataclasses.asdict(x)))


def _error(status: int, message: str) -> web.Response:
    return _json({"error": message}, status)


def _int(raw: str | None, name: str, *, low: int = 0, high: int | None = None) -> int | None:
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConsoleError(400, f"{name}: expected an integer, got {raw!r}") from None
    if value < low or (high is not None and value > high):
        raise ConsoleError(400, f"{name}: {value} is out of range ({low}..{high if high is not None else ''})")
    return value


def _topic_name(name: str) -> str:
    if not TOPIC_NAME.match(name) or name in (".", ".."):
        raise ConsoleError(400, f"topic name {name!r} is invalid: up to 249 of a-z A-Z 0-9 . _ -")
    return name


def _bytes(raw: Any, name: str, encoding: str) -> bytes | None:
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise ConsoleError(400, f"{name}: expected a string")
    if encoding == "base64":
        try:
            return base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            raise ConsoleError(400, f"{name}: not valid base64") from None
    return raw.encode()


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ConsoleError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ConsoleError(400, "the request body must be a JSON object")
    return body


def _confirmed(request: web.Request, name: str, what: str) -> None:
    if request.query.get("confirm") != name:
        raise ConsoleError(400, f"deleting {what} {name!r} needs ?confirm={name}")


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
        self.failed_logins = 0

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=MAX_BODY)
        r = app.router
        r.add_get("/", self._index)
        r.add_static("/static/", STATIC, show_index=False)
        r.add_get("/api/session", self._session)
        r.add_post("/api/login", self._login)
        r.add_post("/api/logout", self._logout)
        r.add_get("/api/overview", self._overview)
        r.add_get("/api/topics", self._topics)
        r.add_post("/api/topics", self._create_topic)
        r.add_get("/api/topics/{name}", self._topic)
        r.add_patch("/api/topics/{name}/configs", self._alter_configs)
        r.add_delete("/api/topics/{name}", self._delete_topic)
        r.add_get("/api/topics/{name}/partitions/{partition}/messages", self._messages)
        r.add_post("/api/topics/{name}/messages", self._produce)
        r.add_get("/api/groups", self._groups)
        r.add_get("/api/groups/{group}", self._group)
        r.add_post("/api/groups/{group}/reset-offsets", self._reset_offsets)
        r.add_delete("/api/groups/{group}", self._delete_group)
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
            response = _error(e.status, e.message)
        except web.HTTPRequestEntityTooLarge:
            response = _error(413, f"the request body is larger than {MAX_BODY} bytes")
        except web.HTTPException as e:
            if e.status >= 400:
                response = _error(e.status, e.reason)
            else:
                raise
        except Exception:
            log.exception("console: %s %s failed", request.method, request.path)
            response = _error(500, "internal error: see the broker's log")
        response.headers.update(SECURITY_HEADERS)
        return response

    # ---------------------------------------------------------------- login

    async def _index(self, _request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "index.html")

    async def _session(self, request: web.Request) -> web.Response:
        session = self.sessions.get(request.cookies.get(COOKIE))
        return _json({"logged_in": session is not None, "username": session.username if session else None,
                      "csrf": session.csrf if session else None,
                      "login_disabled": self.policy.disabled_reason or None, "links": self.links})

    async def _login(self, request: web.Request) -> web.Response:
        if self.policy.credentials is None:
            raise ConsoleError(403, self.policy.disabled_reason)
        body = await _body(request)
        username, password = body.get("username"), body.get("password")
        if not isinstance(username, str) or not isinstance(password, str):
            raise ConsoleError(400, "username and password: expected two strings")
        if not self.policy.admits(username, password):
            self.failed_logins += 1
            delay = self.throttle.failed(request.remote or "")
            log.warning("console: failed login for %r from %s (%d failed so far)", username, request.remote,
                        self.failed_logins)
            await asyncio.sleep(delay)
            raise ConsoleError(401, "wrong username or password")
        session = self.sessions.open(username)
        log.info("console: %r logged in from %s", username, request.remote)
        response = _json({"logged_in": True, "username": username, "csrf": session.csrf})
        self._set_cookie(response, session)
        return response

    def _set_cookie(self, response: web.Response, session: Session) -> None:
        response.set_cookie(COOKIE, session.id, max_age=int(self.sessions.ttl_s), path="/", httponly=True,
                            samesite="Strict", secure=self.secure_cookies)

    async def _logout(self, request: web.Request) -> web.Response:
        self.sessions.close(request[SESSION].id)
        response = _json({"logged_in": False})
        response.del_cookie(COOKIE, path="/")
        return response

    # ---------------------------------------------------------------- pages

    async def _overview(self, _request: web.Request) -> web.Response:
        return _json(await self.view.overview())

    async def _topics(self, _request: web.Request) -> web.Response:
        return _json(await self.view.topics())

    async def _topic(self, request: web.Request) -> web.Response:
        return _json(await self.view.topic(_topic_name(request.match_info["name"])))

    async def _create_topic(self, request: web.Request) -> web.Response:
        body = await _body(request)
        name = _topic_name(str(body.get("name", "")))
        partitions = _int(str(body.get("partitions", 1)), "partitions", low=1, high=100_000)
        configs = body.get("configs") or {}
        if not isinstance(configs, dict) or not all(isinstance(v, str | int) for v in configs.values()):
            raise ConsoleError(400, "configs: expected an object of config names to values")
        assert partitions is not None
        await self.view.create_topic(name, partitions, {str(k): str(v) for k, v in configs.items()})
        return _json({"created": name}, 201)

    async def _alter_configs(self, request: web.Request) -> web.Response:
        name = _topic_name(request.match_info["name"])
        body = await _body(request)
        set_configs, delete = body.get("set") or {}, body.get("delete") or []
        if not isinstance(set_configs, dict) or not isinstance(delete, list):
            raise ConsoleError(400, 'expected {"set": {name: value}, "delete": [name]}')
        await self.view.alter_topic_configs(name, {str(k): str(v) for k, v in set_configs.items()},
                                            [str(d) for d in delete])
        return _json(await self.view.topic(name))

    async def _delete_topic(self, request: web.Request) -> web.Response:
        name = _topic_name(request.match_info["name"])
        _confirmed(request, name, "topic")
        await self.view.delete_topic(name)
        return _json({"deleted": name})

    async def _messages(self, request: web.Request) -> web.Response:
        name = _topic_name(request.match_info["name"])
        partition = _int(request.match_info["partition"], "partition")
        offset = _int(request.query.get("offset"), "offset")
        timestamp = _int(request.query.get("timestamp"), "timestamp")
        limit = _int(request.query.get("limit"), "limit", low=1, high=MAX_PAGE) or 50
        if offset is not None and timestamp is not None:
            raise ConsoleError(400, "give offset or timestamp, not both")
        assert partition is not None
        return _json(await self.view.messages(name, partition, offset=offset, timestamp=timestamp, limit=limit))

    async def _produce(self, request: web.Request) -> web.Response:
        name = _topic_name(request.match_info["name"])
        body = await _body(request)
        encoding = body.get("encoding", "text")
        if encoding not in ("text", "base64"):
            raise ConsoleError(400, "encoding: expected text or base64")
        raw_partition = body.get("partition")
        partition = None if raw_partition in (None, "") else _int(str(raw_partition), "partition")
        headers = body.get("headers") or {}
        if not isinstance(headers, dict):
            raise ConsoleError(400, "headers: expected an object of header names to values")
        produced = await self.view.produce(
            name, partition, _bytes(body.get("key"), "key", encoding), _bytes(body.get("value"), "value", encoding),
            [(str(k), _bytes(v, f"header {k}", encoding) or b"") for k, v in headers.items()])
        return _json(produced, 201)

    async def _groups(self, _request: web.Request) -> web.Response:
        return _json(await self.view.groups())

    async def _group(self, request: web.Request) -> web.Response:
        detail = await self.view.group(request.match_info["group"])
        return _json({**dataclasses.asdict(detail), "total_lag": detail.total_lag})

    async def _reset_offsets(self, request: web.Request) -> web.Response:
        group = request.match_info["group"]
        body = await _body(request)
        topic = _topic_name(str(body.get("topic", "")))
        to = body.get("to")
        if to not in ("earliest", "latest", "offset", "timestamp"):
            raise ConsoleError(400, "to: expected earliest, latest, offset or timestamp")
        value = None
        if to in ("offset", "timestamp"):
            value = _int(str(body.get("value", "")), to)
            if value is None:
                raise ConsoleError(400, f"{to}: a value is needed")
        return _json({"group": group, "offsets": await self.view.reset_offsets(group, topic, to, value)})

    async def _delete_group(self, request: web.Request) -> web.Response:
        group = request.match_info["group"]
        _confirmed(request, group, "group")
        await self.view.delete_group(group)
        return _json({"deleted": group})
