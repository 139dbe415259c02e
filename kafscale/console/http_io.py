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


LONG_MAX = 2**63 - 1  # offsets and timestamps are Kafka int64s
INT_MAX = 2**31 - 1  # partitions and shard ids are int32s


def integer(raw: Any, name: str, *, low: int = 0, high: int = LONG_MAX) -> int | None:
    if raw is None or raw == "":
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise ConsoleError(400, f"{name}: expected an integer, got {raw!r}")
    try:
        value = int(raw)
    except ValueError:
        raise ConsoleError(400, f"{name}: expected an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise ConsoleError(400, f"{name}: {value} is out of range ({low}..{high})")
    return value


def required_integer(raw: Any, name: str, *, low: int = 0, high: int = LONG_MAX) -> int:
    value = integer(raw, name, low=low, high=high)
    if value is None:
        raise ConsoleError(400, f"{name}: a value is needed")
    return value


def text(raw: Any, name: str) -> str:
    if not isinstance(raw, str) or not raw:
        raise ConsoleError(400, f"{name}: expected a non-empty string")
    return raw


def topic_name(name: Any) -> str:
    """A topic name from the path or a body: a string of Kafka's legal characters (null is no name "None")."""
    if not isinstance(name, str) or not TOPIC_NAME.match(name) or name in (".", ".."):
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


async def body(request: web.Request, *fields: str) -> dict[str, Any]:
    """The request's JSON object, of these fields only: a misspelt one ("partiton") is refused, not ignored."""
    # JSON only: a browser sends it cross-site only after a preflight this server never allows, where a form's
    # text/plain would go straight through.
    if request.content_type != "application/json":
        raise ConsoleError(415, f"expected Content-Type application/json, got {request.content_type or 'none'}")
    try:
        found = await request.json()
    except LookupError:
        raise ConsoleError(415, f"unknown charset {request.charset!r}: send UTF-8 JSON") from None
    except (ValueError, RecursionError):  # not JSON, not UTF-8, an integer past Python's digits, nested too deep
        raise ConsoleError(400, "the request body is not valid JSON") from None
    if not isinstance(found, dict):
        raise ConsoleError(400, "the request body must be a JSON object")
    unknown = sorted(set(found) - set(fields))
    if unknown:
        raise ConsoleError(400, f"unknown field {unknown[0]!r}: expected {', '.join(fields)}")
    return found


def settings(raw: Any, name: str) -> dict[str, str]:
    """An object of config (or header) names to string or number values."""
    if not isinstance(raw, dict) or not all(isinstance(v, str | int | float) and not isinstance(v, bool)
                                            for v in raw.values()):
        raise ConsoleError(400, f"{name}: expected an object of names to string or number values")
    return {str(k): str(v) for k, v in raw.items()}


def confirmed(request: web.Request, name: str, what: str) -> None:
    """Deleting asks for the name again: a slip of the mouse deletes nothing."""
    if request.query.get("confirm") != name:
        raise ConsoleError(400, f"deleting {what} {name!r} needs ?confirm={name}")
