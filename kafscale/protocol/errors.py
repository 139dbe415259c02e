"""Kafka error codes and the exceptions the protocol layer raises for input it cannot accept.

`ErrorCode` is kio's enum (generated from Kafka's `Errors` list): members are snake_case
(`ErrorCode.not_leader_or_follower`), compare equal to their int value and carry `.retriable`.
Handlers put these into responses; the exceptions below never reach a client, the listener
turns them into a closed connection the way Kafka's SocketServer does.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

__all__ = [
    "INVALID_REGULAR_EXPRESSION",
    "ErrorCode",
    "InvalidFrameSize",
    "InvalidRequestHeader",
    "MalformedRequest",
    "NewerErrorCode",
    "ProtocolError",
    "UnknownApiKey",
    "UnsupportedApiVersion",
    "error_code",
    "is_retriable",
]


class NewerErrorCode(int):
    """A code Kafka added after kio 0.6.2 (pinned) was generated: an int that kio's writer takes as it takes an
    ErrorCode (it writes `.value`), and that compares equal to its number."""

    def __new__(cls, value: int, name: str) -> NewerErrorCode:
        code = super().__new__(cls, value)
        code._name = name
        return code

    @property
    def value(self) -> int:
        return int(self)

    @property
    def name(self) -> str:
        return self._name

    _name: str


INVALID_REGULAR_EXPRESSION = NewerErrorCode(128, "invalid_regular_expression")


def error_code(value: int | ErrorCode) -> ErrorCode:
    """The ErrorCode for a numeric code; a code kio does not know maps to UNKNOWN_SERVER_ERROR.

    Useful where codes travel as plain ints (Ray messages, the metadata store).
    """
    if isinstance(value, ErrorCode):
        return value
    try:
        return ErrorCode(value)
    except ValueError:
        return ErrorCode.unknown_server_error


def is_retriable(value: int | ErrorCode) -> bool:
    return error_code(value).retriable


class ProtocolError(Exception):
    """The client sent bytes that are not a request we can serve; the connection must be closed."""


class InvalidFrameSize(ProtocolError):
    def __init__(self, size: int, max_size: int) -> None:
        super().__init__(f"invalid frame size {size} (allowed 0..{max_size})")
        self.size = size
        self.max_size = max_size


class InvalidRequestHeader(ProtocolError):
    """The request header itself is truncated or inconsistent."""


class UnknownApiKey(ProtocolError):
    def __init__(self, api_key: int) -> None:
        super().__init__(f"unknown API key {api_key}")
        self.api_key = api_key


class UnsupportedApiVersion(ProtocolError):
    def __init__(self, api_key: int, api_version: int) -> None:
        super().__init__(f"unsupported version {api_version} of API key {api_key}")
        self.api_key = api_key
        self.api_version = api_version


class MalformedRequest(ProtocolError):
    """The body does not decode with the schema of its (api_key, version)."""

    def __init__(self, api_key: int, api_version: int, reason: str) -> None:
        super().__init__(f"malformed body for API key {api_key} v{api_version}: {reason}")
        self.api_key = api_key
        self.api_version = api_version
        self.reason = reason
