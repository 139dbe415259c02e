"""Who may log in to the console: one username and password, from the environment only (seed 003).

There are no defaults. When either variable is unset or empty, the login page says that access is disabled
and why, and every login is refused. Both values are compared in constant time, and through a digest so that
their lengths do not show either.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field

USERNAME_ENV = "KAFSCALE_UI_USERNAME"
PASSWORD_ENV = "KAFSCALE_UI_PASSWORD"


def console_login_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The two variables, for handing to whoever serves the console."""
    return {k: environ[k] for k in (USERNAME_ENV, PASSWORD_ENV) if k in environ}


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()


@dataclass(frozen=True, slots=True)
class UiCredentials:
    username: str
    password: str = field(repr=False)

    def admits(self, username: str, password: str) -> bool:
        # Both compared every time: which of the two was wrong takes the same time to find.
        user_ok = hmac.compare_digest(_digest(username), _digest(self.username))
        password_ok = hmac.compare_digest(_digest(password), _digest(self.password))
        return user_ok and password_ok


@dataclass(frozen=True, slots=True)
class LoginPolicy:
    """The credentials, or why there are none (then every login is refused)."""

    credentials: UiCredentials | None
    disabled_reason: str = ""

    @staticmethod
    def from_env(environ: Mapping[str, str]) -> LoginPolicy:
        missing = [name for name in (USERNAME_ENV, PASSWORD_ENV) if not environ.get(name)]
        if missing:
            return LoginPolicy(None, "UI access is disabled: " + " and ".join(missing)
                               + (" is" if len(missing) == 1 else " are")
                               + " not set. Set both on the broker to enable the console.")
        return LoginPolicy(UiCredentials(environ[USERNAME_ENV], environ[PASSWORD_ENV]))

    def admits(self, username: str, password: str) -> bool:
        return self.credentials is not None and self.credentials.admits(username, password)
