"""The console's HTTP API over real HTTP, beside an in-process broker on the embedded stores, with real clients.

What a client did (a topic, its messages, a group and its lag) shows through the API; every change needs a
session and its CSRF token; bad input gets a 4xx naming what was wrong and changes nothing.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pytest
import requests
from confluent_kafka import Consumer, TopicPartition

from kafscale.console.server import ConsoleServer
from kafscale.console.sessions import COOKIE, CSRF_HEADER
from kafscale.testing.console import console_beside, stop_console
from tests.integration.conftest import Cluster, unique_topic, wait_until
from tests.integration.console.conftest import LOGIN_ENV, PASSWORD, USER, logged_in, make_topic, produce


def test_logins_follow_the_two_variables(console: ConsoleServer, broker_embedded: Cluster) -> None:
    page = requests.get(console.url, timeout=10)
    assert page.status_code == 200 and "Kafscale console" in page.text
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    assert requests.get(console.url + "api/session", timeout=10).json()["login_disabled"] is None

    wrong = requests.post(console.url + "api/login", json={"username": USER, "password": "guess"}, timeout=10)
    assert wrong.status_code == 401 and wrong.json() == {"error": "wrong username or password"}
    assert COOKIE not in wrong.cookies
    assert requests.get(console.url + "api/topics", timeout=10).status_code == 401

    r = requests.post(console.url + "api/login", json={"username": USER, "password": PASSWORD}, timeout=10)
    assert r.status_code == 200
    cookie = r.headers["Set-Cookie"]
    assert f"{COOKIE}=" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert "Secure" not in cookie  # plain HTTP here; over TLS the cookie is Secure

    # Without the variables the page says why, and no login gets in, not even an empty one.
    disabled = console_beside(broker_embedded.broker, {"KAFSCALE_UI_USERNAME": USER})
    try:
        reason = requests.get(disabled.url + "api/session", timeout=10).json()["login_disabled"]
        assert reason == ("UI access is disabled: KAFSCALE_UI_PASSWORD is not set. Set both on the broker to enable "
                          "the console.")
        for attempt in ({"username": USER, "password": PASSWORD}, {"username": USER, "password": ""}):
            refused = requests.post(disabled.url + "api/login", json=attempt, timeout=10)
            assert refused.status_code == 403 and refused.json()["error"] == reason
    finally:
        stop_console(broker_embedded.broker, disabled)


def test_failed_logins_are_counted_and_slowed_down(console: ConsoleServer) -> None:
    before = console.api.throttle.total
    took = []
    for _ in range(12):
        started = time.monotonic()
        r = requests.post(console.url + "api/login", json={"username": USER, "password": "nope"}, timeout=30)
        took.append(time.monotonic() - started)
        assert r.status_code == 401
    assert console.api.throttle.total - before == 12
    assert min(took) >= 0.1  # Kafka's failed-authentication delay, at least, for every failure


def test_logins_from_one_address_are_answered_one_at_a_time(console: ConsoleServer) -> None:
    """Parallel guesses gain nothing: while one login from an address waits out its slowdown, the others are
    refused at once (429) without their password being tried."""
    from concurrent.futures import ThreadPoolExecutor

    def guess(_: int) -> int:
        return requests.post(console.url + "api/login", json={"username": USER, "password": "guess"},
                             timeout=30).status_code

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(guess, range(8)))
    assert set(codes) <= {401, 429} and 429 in codes and 401 in codes


def test_a_body_that_is_not_json_is_refused_before_anything_is_read(console: ConsoleServer) -> None:
    """A form of another site posts text/plain without a preflight: the API reads JSON only."""
    form = requests.post(console.url + "api/login", data=f'{{"username": "{USER}", "password": "{PASSWORD}"}}',
                         headers={"Content-Type": "text/plain"}, timeout=10)
    assert form.status_code == 415 and "application/json" in form.json()["error"]
    assert COOKIE not in form.cookies


def test_changes_need_the_sessions_csrf_token_and_a_live_session(console: ConsoleServer) -> None:
    s = logged_in(console)
    topic = unique_topic("console-csrf")
    for token in (None, "forged"):
        headers = {CSRF_HEADER: token} if token else {}
        r = requests.post(console.url + "api/topics", json={"name": topic, "partitions": 1}, timeout=10,
                          cookies=s.cookies, headers=headers)
        assert r.status_code == 403 and "CSRF" in r.json()["error"]
    assert topic not in [t["name"] for t in s.get(console.url + "api/topics", timeout=30).json()]

    assert s.post(console.url + "api/logout", timeout=10).status_code == 200
    stale = requests.get(console.url + "api/topics", cookies={COOKIE: s.cookies.get(COOKIE) or "x"}, timeout=10)
    assert stale.status_code == 401 and "log in again" in stale.json()["error"]


def test_a_clients_topic_and_messages_show_and_a_test_message_is_produced(console: ConsoleServer,
                                                                          broker_embedded: Cluster) -> None:
    bootstrap = broker_embedded.bootstrap
    topic = unique_topic("console-topic")
    make_topic(bootstrap, topic, 2)
    produce(bootstrap, topic, [(f"k{i}".encode(), json.dumps({"n": i}).encode()) for i in range(30)])
    s = logged_in(console)

    summary = wait_until(lambda: next((t for t in s.get(console.url + "api/topics", timeout=30).json()
                                       if t["name"] == topic and t["records"] == 30), None), what="the topic")
    assert summary["partitions"] == 2
    detail = s.get(console.url + f"api/topics/{topic}", timeout=30).json()
    assert [(p["partition"], p["earliest"], p["latest"]) for p in detail["partitions"]] == [(0, 0, 30), (1, 0, 0)]
    configs = {c["name"]: c for c in detail["configs"]}
    assert configs["cleanup.policy"]["value"] == "delete" and configs["cleanup.policy"]["is_default"]
    assert configs["cleanup.policy"]["source"] == "DEFAULT_CONFIG"

    page = s.get(console.url + f"api/topics/{topic}/partitions/0/messages", params={"offset": 10, "limit": 5},
                 timeout=30).json()
    assert page["start"] == 10 and page["latest"] == 30
    assert [m["offset"] for m in page["messages"]] == [10, 11, 12, 13, 14]
    first = page["messages"][0]
    assert base64.b64decode(first["key"]) == b"k10" and json.loads(base64.b64decode(first["value"])) == {"n": 10}
    assert [(h["key"], base64.b64decode(h["value"])) for h in first["headers"]] == [("origin", b"test")]

    stamp = first["timestamp"]
    by_time = s.get(console.url + f"api/topics/{topic}/partitions/0/messages",
                    params={"timestamp": stamp, "limit": 1}, timeout=30).json()
    assert by_time["messages"][0]["timestamp"] >= stamp and by_time["start"] <= 10

    made = s.post(console.url + f"api/topics/{topic}/messages",
                  json={"partition": 1, "key": "hello", "value": "from the console", "headers": {"h": "v"}}, timeout=30)
    assert made.status_code == 201 and made.json() == {"topic": topic, "partition": 1, "offset": 0}
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_topic("g"), "auto.offset.reset": "earliest"})
    try:
        c.assign([TopicPartition(topic, 1, 0)])
        msg = wait_until(lambda: c.poll(1.0), what="the console's message")
        assert (msg.key(), msg.value(), msg.headers()) == (b"hello", b"from the console", [("h", b"v")])
    finally:
        c.close()


def test_topics_are_created_altered_and_deleted_only_when_confirmed(console: ConsoleServer) -> None:
    s = logged_in(console)
    topic = unique_topic("console-made")
    r = s.post(console.url + "api/topics", json={"name": topic, "partitions": 3,
                                                 "configs": {"cleanup.policy": "compact"}}, timeout=30)
    assert r.status_code == 201, r.text
    again = s.post(console.url + "api/topics", json={"name": topic, "partitions": 3}, timeout=30)
    assert again.status_code == 409 and "TOPIC_ALREADY_EXISTS" in again.json()["error"]
    altered = s.patch(console.url + f"api/topics/{topic}/configs", json={"set": {"retention.ms": "60000"}}, timeout=30)
    assert altered.status_code == 200
    configs = {c["name"]: (c["value"], c["source"]) for c in altered.json()["configs"]}
    assert configs["retention.ms"] == ("60000", "DYNAMIC_TOPIC_CONFIG")
    assert configs["cleanup.policy"] == ("compact", "DYNAMIC_TOPIC_CONFIG")
    bad_config = s.patch(console.url + f"api/topics/{topic}/configs", json={"set": {"retention.ms": "soon"}},
                         timeout=30)
    assert bad_config.status_code == 400 and "INVALID_CONFIG" in bad_config.json()["error"]

    unconfirmed = s.delete(console.url + f"api/topics/{topic}", timeout=30)
    assert unconfirmed.status_code == 400 and f"?confirm={topic}" in unconfirmed.json()["error"]
    assert s.get(console.url + f"api/topics/{topic}", timeout=30).status_code == 200
    assert s.delete(console.url + f"api/topics/{topic}", params={"confirm": topic}, timeout=30).status_code == 200
    wait_until(lambda: s.get(console.url + f"api/topics/{topic}", timeout=30).status_code == 404,
               what="the topic gone")


@pytest.mark.parametrize(("method", "path", "body", "status", "says"), [
    ("GET", "api/topics/{topic}/partitions/0/messages?offset=ten", None, 400, "offset: expected an integer"),
    ("GET", "api/topics/{topic}/partitions/0/messages?limit=100000", None, 400, "limit: 100000 is out of range"),
    ("GET", "api/topics/{topic}/partitions/0/messages?offset=1&timestamp=2", None, 400, "not both"),
    ("GET", "api/topics/{topic}/partitions/0/messages?offset=" + "9" * 30, None, 400, "offset: 999"),
    ("GET", "api/topics/{topic}/partitions/99999999999/messages", None, 400, "partition: 99999999999 is out of range"),
    ("POST", "api/topics/{topic}/messages", {"value": "x", "partition": 5}, 404, "has no partition 5"),
    ("POST", "api/topics/no-such-topic-here/messages", {"value": "x"}, 404, "UNKNOWN_TOPIC_OR_PART"),
    ("PATCH", "api/topics/{topic}/configs", {"set": {"retention.ms": None}}, 400, "set: expected an object"),
    ("POST", "api/topics", {"name": "x", "configs": {"a": True}}, 400, "configs: expected an object"),
    ("GET", "api/topics/{topic}/partitions/7/messages", None, 404, "has no partition 7"),
    ("GET", "api/topics/no-such-topic-here/partitions/0/messages", None, 404, "UNKNOWN_TOPIC_OR_PART"),
    ("GET", "api/topics/no-such-topic-here", None, 404, "UNKNOWN_TOPIC_OR_PART"),
    ("GET", "api/topics/bad%20name", None, 400, "topic name 'bad name' is invalid"),
    ("POST", "api/topics", "not json", 400, "not valid JSON"),
    ("POST", "api/topics", [1, 2], 400, "must be a JSON object"),
    ("POST", "api/topics", {"name": "x", "partitions": 0}, 400, "partitions: 0 is out of range"),
    ("POST", "api/topics/{topic}/messages", {"value": "x", "encoding": "base64"}, 400, "value: not valid base64"),
    ("GET", "api/groups/no-such-group", None, 404, "does not exist"),
    ("POST", "api/groups/g/reset-offsets", {"topic": "{topic}", "to": "yesterday"}, 400, "to: expected"),
    ("DELETE", "api/groups/g", None, 400, "?confirm=g"),
])
def test_bad_input_gets_a_clear_error(console: ConsoleServer, broker_embedded: Cluster, method: str, path: str,
                                      body: object, status: int, says: str) -> None:
    topic = unique_topic("console-bad")
    make_topic(broker_embedded.bootstrap, topic, 1)
    s = logged_in(console)
    data = body if isinstance(body, str) else json.dumps(body).replace("{topic}", topic) if body is not None else None
    r = s.request(method, console.url + path.format(topic=topic), data=data, timeout=30,
                  headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    assert says in r.json()["error"]


def test_a_groups_members_offsets_and_lag_show_and_its_offsets_reset(console: ConsoleServer,
                                                                      broker_embedded: Cluster) -> None:
    bootstrap = broker_embedded.bootstrap
    topic, group = unique_topic("console-group"), unique_topic("console-g")
    make_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, [(None, b"v%d" % i) for i in range(20)])
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    s = logged_in(console)
    try:
        c.subscribe([topic])
        read = 0
        deadline = time.monotonic() + 60
        while read < 12 and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is not None and m.error() is None:
                read += 1
        assert read >= 12
        c.commit(offsets=[TopicPartition(topic, 0, 12)], asynchronous=False)
        live = s.get(console.url + f"api/groups/{group}", timeout=30).json()
        assert live["state"] == "STABLE" and len(live["members"]) == 1
        assert live["members"][0]["assignment"] == [f"{topic}-0"]
        busy = s.post(console.url + f"api/groups/{group}/reset-offsets", json={"topic": topic, "to": "earliest"},
                      timeout=30)
        assert busy.status_code == 409, busy.text  # Kafka refuses to move a live group's offsets
    finally:
        c.close()
    stopped = wait_until(lambda: (g := s.get(console.url + f"api/groups/{group}", timeout=30).json())["state"]
                         == "EMPTY" and g, what="the group empty")
    assert stopped["offsets"] == [{"topic": topic, "partition": 0, "committed": 12, "latest": 20, "lag": 8}]
    assert stopped["total_lag"] == 8
    listed = {g["group_id"]: g for g in s.get(console.url + "api/groups", timeout=30).json()}
    assert listed[group]["state"] == "EMPTY" and listed[group]["members"] == 0

    reset = s.post(console.url + f"api/groups/{group}/reset-offsets", json={"topic": topic, "to": "earliest"},
                   timeout=30)
    assert reset.status_code == 200, reset.text
    assert reset.json()["offsets"][0]["committed"] == 0
    assert s.get(console.url + f"api/groups/{group}", timeout=30).json()["total_lag"] == 20
    assert s.delete(console.url + f"api/groups/{group}", params={"confirm": group}, timeout=30).status_code == 200
    assert s.get(console.url + f"api/groups/{group}", timeout=30).status_code == 404


def test_the_overview_shows_the_shards(console: ConsoleServer, broker_embedded: Cluster) -> None:
    s = logged_in(console)
    o = s.get(console.url + "api/overview", timeout=30).json()
    shards = [sh for n in o["nodes"] for sh in n["shards"]]
    assert [(sh["id"], sh["live"], sh["port"]) for sh in shards] == [(0, True, broker_embedded.port)]


def test_with_a_certificate_the_console_serves_https_and_its_cookie_is_secure(broker_embedded: Cluster,
                                                                             tmp_path: Path) -> None:
    from tests.integration.pki import make_pki

    pki = make_pki(tmp_path)
    server = console_beside(broker_embedded.broker, LOGIN_ENV, ssl_certfile=str(pki.cert_file),
                            ssl_keyfile=str(pki.key_file))
    try:
        assert server.url.startswith("https://127.0.0.1:")
        r = requests.post(server.url + "api/login", json={"username": USER, "password": PASSWORD},
                          verify=str(pki.ca_file), timeout=30)
        assert r.status_code == 200
        cookie = r.headers["Set-Cookie"]
        assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(server.url.replace("https://", "http://") + "api/session", timeout=10)
    finally:
        stop_console(broker_embedded.broker, server)
