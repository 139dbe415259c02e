"""The console's login rules without a server: the two variables, constant-time checks, sessions, CSRF."""

from __future__ import annotations

import pytest

from kafscale.console.credentials import LoginPolicy, UiCredentials, console_login_env
from kafscale.console.kafka_clients import read_client_config
from kafscale.console.sessions import MAX_SESSIONS, Sessions


@pytest.mark.parametrize(("environ", "reason"), [
    ({}, "KAFSCALE_UI_USERNAME and KAFSCALE_UI_PASSWORD are not set"),
    ({"KAFSCALE_UI_USERNAME": "ops"}, "KAFSCALE_UI_PASSWORD is not set"),
    ({"KAFSCALE_UI_PASSWORD": "pw"}, "KAFSCALE_UI_USERNAME is not set"),
    ({"KAFSCALE_UI_USERNAME": "", "KAFSCALE_UI_PASSWORD": "pw"}, "KAFSCALE_UI_USERNAME is not set"),
])
def test_without_both_variables_no_login_gets_in(environ: dict[str, str], reason: str) -> None:
    policy = LoginPolicy.from_env(environ)
    assert policy.credentials is None and reason in policy.disabled_reason
    assert policy.disabled_reason.startswith("UI access is disabled: ")
    for username, password in (("ops", "pw"), ("", ""), ("admin", "admin")):
        assert not policy.admits(username, password)


def test_only_the_exact_pair_gets_in_and_the_password_never_shows() -> None:
    policy = LoginPolicy.from_env({"KAFSCALE_UI_USERNAME": "ops", "KAFSCALE_UI_PASSWORD": "pw ü", "OTHER": "x"})
    assert policy.disabled_reason == "" and policy.admits("ops", "pw ü")
    for username, password in (("ops", "pw"), ("ops", "pw üx"), ("Ops", "pw ü"), ("", "pw ü"), ("ops", "")):
        assert not policy.admits(username, password)
    assert "pw" not in repr(policy) and "pw" not in repr(UiCredentials("ops", "pw"))
    assert console_login_env({"KAFSCALE_UI_USERNAME": "ops", "KAFSCALE_UI_PASSWORD": "pw", "HOME": "/"}) == {
        "KAFSCALE_UI_USERNAME": "ops", "KAFSCALE_UI_PASSWORD": "pw"}


def test_sessions_expire_close_and_stay_bounded() -> None:
    now = [1000.0]
    sessions = Sessions(ttl_s=60, clock=lambda: now[0])
    s = sessions.open("ops")
    assert sessions.get(s.id) == s and s.csrf_matches(s.csrf)
    assert not s.csrf_matches(None) and not s.csrf_matches("") and not s.csrf_matches(s.csrf + "x")
    assert sessions.get(None) is None and sessions.get("forged") is None
    now[0] += 59
    assert sessions.get(s.id) == s
    now[0] += 1
    assert sessions.get(s.id) is None and len(sessions) == 0  # expired, and forgotten

    t = sessions.open("ops")
    sessions.close(t.id)
    assert sessions.get(t.id) is None
    first = sessions.open("ops")
    for _ in range(MAX_SESSIONS):
        sessions.open("ops")
    assert len(sessions) == MAX_SESSIONS and sessions.get(first.id) is None  # the oldest went first


def test_the_consoles_client_settings_are_read_from_a_properties_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "console.properties"
    path.write_text("# the console's principal\nsecurity.protocol = SASL_SSL\nsasl.mechanism=SCRAM-SHA-256\n\n"
                    "sasl.password=a=b\n")
    assert read_client_config(str(path)) == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
                                             "sasl.password": "a=b"}
    assert read_client_config("") == {}
    path.write_text("security.protocol\n")
    with pytest.raises(ValueError, match=r"console.properties:1: expected key=value"):
        read_client_config(str(path))
