"""Reading the console's requests and writing its answers: every bad input becomes a ConsoleError naming it."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import re
from typing import Any

from aiohttp import web

from kafscale.console.view import ConsoleError

TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


def answer(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status,
                             dumps=lambda o: json.dumps(o, default=lambda x: dataclasses.asdict(x)))


def error(status: int, message: str) -> web.Response:
    return answer({"error": message}, status)


def integer(raw: Any, name: str, *, low: int = 0, high: int | None = None) -> int | None:
    if raw is None or raw == "":
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise ConsoleError(400, f"{name}: expected an integer, got {raw!r}")
    try:
        value = int(raw)
    except ValueError:
        raise ConsoleError(400, f"{name}: expected an integer, got {raw!r}") from None
    if value < low or (high is not None and value > high):
        raise ConsoleError(400, f"{name}: {value} is out of range ({low}..{high if high is not None else ''})")
    return value


def required_integer(raw: Any, name: str, *, low: int = 0, high: int | None = None) -> int:
    value = integer(raw, name, low=low, high=high)
    if value is None:
        raise ConsoleError(400, f"{name}: a value is needed")
    return value


def text(raw: Any, name: str) -> str:
    if not isinstance(raw, str) or not raw:
        raise ConsoleError(400, f"{name}: expected a non-empty string")
    return raw


def topic_name(name: str) -> str:
    if not TOPIC_NAME.match(name) or name in (".", ".."):
        raise ConsoleError(400, f"topic name {name!r} is invalid: up to 249 of a-z A-Z 0-9 . _ -")
    return name


def payload(raw: Any, name: str, encoding: str) -> bytes | None:
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


async def body(request: web.Request) -> dict[str, Any]:
    try:
        found = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ConsoleError(400, "the request body is not valid JSON") from None
    if not isinstance(found, dict):
        raise ConsoleError(400, "the request body must be a JSON object")
    return found


def confirmed(request: web.Request, name: str, what: str) -> None:
    """Deleting asks for the name again: a slip of the mouse deletes nothing."""
    if request.query.get("confirm") != name:
        raise ConsoleError(400, f"deleting {what} {name!r} needs ?confirm={name}")
