"""The console's HTTP API without a broker: an in-memory ClusterView behind ConsoleApi, over loopback HTTP.

The fake view records every call it gets, so each test checks both the answer and what reached the cluster:
bad input, a missing CSRF token or an unconfirmed delete must get a 4xx naming the problem and reach nothing.
(tests/integration/console/test_api.py runs the same API against a real broker and real clients.)
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from kafscale.console.api import SECURITY_HEADERS, ConsoleApi
from kafscale.console.credentials import LoginPolicy, UiCredentials
from kafscale.console.sessions import COOKIE, CSRF_HEADER
from kafscale.console.view import (
    AclEntry,
    ConfigEntry,
    ConsoleError,
    GroupDetail,
    GroupSummary,
    Header,
    Message,
    MessagePage,
    PartitionLag,
    PartitionState,
    PlannedMove,
    Produced,
    ResetTo,
    ScramCredential,
    ScramUser,
    TopicDetail,
    TopicSummary,
)

USER, PASSWORD = "ops", "pw"
Call = tuple[str, tuple[Any, ...], dict[str, Any]]


class FakeView:
    """A ClusterView over dicts that records each call; `fails` makes every call raise it (after recording)."""

    def __init__(self) -> None:
        self.topic_details = {"orders": TopicDetail(
            "orders", [PartitionState(0, 1, 0, 30, size=4096), PartitionState(1, 2, None, None)],
            [ConfigEntry("cleanup.policy", "delete", "DEFAULT_CONFIG", True, False, False)], physical=2)}
        self.group_details = {"billing": GroupDetail("billing", "EMPTY", "consumer", "range", 0, [],
                                                     [PartitionLag("orders", 0, 12, 30, 18)], 18)}
        self.user_list = [ScramUser("alice", [ScramCredential("SCRAM-SHA-256", 4096)])]
        self.acl_list: list[AclEntry] = []
        self.calls: list[Call] = []
        self.fails: BaseException | None = None

    def _got(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((name, args, kwargs))
        if self.fails is not None:
            raise self.fails

    async def overview(self) -> dict[str, Any]:
        self._got("overview")
        return {"nodes": []}

    async def topics(self) -> list[TopicSummary]:
        self._got("topics")
        return [TopicSummary(t.name, len(t.partitions), sum((p.latest or 0) - (p.earliest or 0) for p in t.partitions))
                for t in self.topic_details.values()]

    async def topic(self, name: str) -> TopicDetail:
        self._got("topic", name)
        if name not in self.topic_details:
            raise ConsoleError(404, f"topic {name!r} does not exist")
        return self.topic_details[name]

    async def create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> None:
        self._got("create_topic", name, partitions, configs)
        self.topic_details[name] = TopicDetail(name, [PartitionState(p, 0, 0, 0) for p in range(partitions)], [])

    async def alter_topic_configs(self, name: str, set_configs: dict[str, str], delete: list[str]) -> None:
        self._got("alter_topic_configs", name, set_configs, delete)

    async def delete_topic(self, name: str) -> None:
        self._got("delete_topic", name)
        self.topic_details.pop(name, None)

    async def messages(self, topic: str, partition: int, *, offset: int | None, timestamp: int | None,
                       limit: int) -> MessagePage:
        self._got("messages", topic, partition, offset=offset, timestamp=timestamp, limit=limit)
        start = offset or 0
        return MessagePage(topic, partition, start, [Message(partition, start, 1_700_000_000_000, "CreateTime", "azE=",
                                                             None, [Header("origin", "dGVzdA==")])], 30)

    async def produce(self, topic: str, partition: int | None, key: bytes | None, value: bytes | None,
                      headers: list[tuple[str, bytes]]) -> Produced:
        self._got("produce", topic, partition, key, value, headers)
        return Produced(topic, partition or 0, 0)

    async def groups(self) -> list[GroupSummary]:
        self._got("groups")
        return [GroupSummary(g.group_id, g.state, g.type, len(g.members)) for g in self.group_details.values()]

    async def group(self, group_id: str) -> GroupDetail:
        self._got("group", group_id)
        return self.group_details[group_id]

    async def reset_offsets(self, group_id: str, topic: str, to: ResetTo, value: int | None) -> list[PartitionLag]:
        self._got("reset_offsets", group_id, topic, to, value)
        return [PartitionLag(topic, 0, value or 0, 30, 30 - (value or 0))]

    async def delete_group(self, group_id: str) -> None:
        self._got("delete_group", group_id)

    async def users(self) -> list[ScramUser]:
        self._got("users")
        return self.user_list

    async def upsert_user(self, name: str, mechanism: str, password: str, iterations: int) -> None:
        self._got("upsert_user", name, mechanism, password, iterations)

    async def delete_user(self, name: str, mechanism: str) -> None:
        self._got("delete_user", name, mechanism)

    async def acls(self) -> list[AclEntry]:
        self._got("acls")
        return self.acl_list

    async def create_acl(self, entry: AclEntry) -> None:
        self._got("create_acl", entry)

    async def delete_acl(self, entry: AclEntry) -> int:
        self._got("delete_acl", entry)
        return 1

    async def move_partition(self, topic: str, partition: int, target: int) -> PlannedMove:
        self._got("move_partition", topic, partition, target)
        return PlannedMove(topic, partition, None, 0, target, True, 0.5)

    async def drain_node(self, node: str) -> list[PlannedMove]:
        self._got("drain_node", node)
        return []

    def close(self) -> None:
        pass


@dataclass
class Console:
    client: TestClient[web.Request, web.Application]
    api: ConsoleApi
    view: FakeView
    csrf: str

    async def ask(self, method: str, path: str, body: Any = None, *, data: str | bytes | None = None,
                  headers: dict[str, str] | None = None, csrf: bool = True) -> tuple[int, Any, dict[str, str]]:
        """One request as the logged-in operator: (status, JSON answer, headers)."""
        sent = {CSRF_HEADER: self.csrf} if csrf and method != "GET" else {}
        async with self.client.request(method, path, json=body, data=data, headers={**sent, **(headers or {})}) as r:
            return r.status, await r.json(), dict(r.headers)


@pytest.fixture
async def console() -> AsyncIterator[Console]:
    view = FakeView()
    api = ConsoleApi(view, LoginPolicy(UiCredentials(USER, PASSWORD)), secure_cookies=False)
    async with TestClient(TestServer(api.app(), host="127.0.0.1")) as client:
        async with client.post("/api/login", json={"username": USER, "password": PASSWORD}) as r:
            assert r.status == 200
            csrf = (await r.json())["csrf"]
        yield Console(client, api, view, csrf)


async def test_topics_and_a_topic_are_answered_as_the_views_dataclasses_in_json(console: Console) -> None:
    status, listed, _ = await console.ask("GET", "/api/topics")
    assert (status, listed) == (200, [{"name": "orders", "partitions": 2, "records": 30, "internal": False}])
    status, detail, _ = await console.ask("GET", "/api/topics/orders")
    assert status == 200 and detail == {
        "name": "orders", "physical": 2,
        "partitions": [{"partition": 0, "leader": 1, "earliest": 0, "latest": 30, "size": 4096},
                       {"partition": 1, "leader": 2, "earliest": None, "latest": None, "size": None}],
        "configs": [{"name": "cleanup.policy", "value": "delete", "source": "DEFAULT_CONFIG", "is_default": True,
                     "sensitive": False, "read_only": False}]}
    assert console.view.calls == [("topics", (), {}), ("topic", ("orders",), {})]


async def test_creating_a_topic_passes_the_parsed_name_partitions_and_configs_to_the_view(console: Console) -> None:
    made = await console.ask("POST", "/api/topics", {"name": "made", "partitions": 3,
                                                     "configs": {"retention.ms": 60000, "cleanup.policy": "compact"}})
    assert made[:2] == (201, {"created": "made"})
    assert (await console.ask("POST", "/api/topics", {"name": "one"}))[0] == 201  # one partition unless told
    assert console.view.calls == [
        ("create_topic", ("made", 3, {"retention.ms": "60000", "cleanup.policy": "compact"}), {}),
        ("create_topic", ("one", 1, {}), {})]


@pytest.mark.parametrize(("data", "content_type", "status", "says"), [
    ('{"name": "t"}', "text/plain", 415, "expected Content-Type application/json, got text/plain"),
    ("name=t", "application/x-www-form-urlencoded", 415, "expected Content-Type application/json"),
    ("not json", "application/json", 400, "the request body is not valid JSON"),
    (b'{"name": "\xff"}', "application/json", 400, "the request body is not valid JSON"),
    ("[1, 2]", "application/json", 400, "the request body must be a JSON object"),
    ('{"name": "t", "partitions": "three"}', "application/json", 400, "partitions: expected an integer, got 'three'"),
    ('{"name": "t", "partitions": 1.5}', "application/json", 400, "partitions: expected an integer, got 1.5"),
    ('{"name": "t", "partitions": true}', "application/json", 400, "partitions: expected an integer, got True"),
    ('{"name": "t", "partitions": 2147483648}', "application/json", 400,
     "partitions: 2147483648 is out of range (1..100000)"),
    ('{"name": "t", "partitions": 0}', "application/json", 400, "partitions: 0 is out of range (1..100000)"),
    ('{"name": "t", "configs": ["a"]}', "application/json", 400, "configs: expected an object of names"),
    ('{"name": "t", "configs": {"a": null}}', "application/json", 400, "configs: expected an object of names"),
    ('{"name": "bad name"}', "application/json", 400, "topic name 'bad name' is invalid"),
    ('{"name": ".."}', "application/json", 400, "topic name '..' is invalid"),
    ("{}", "application/json", 400, "topic name None is invalid"),
    ('{"name": "' + "x" * 250 + '"}', "application/json", 400, "is invalid: up to 249 of"),
    ('{"name": "t", "partiton": 3}', "application/json", 400,  # a typo is no default of 1 partition
     "unknown field 'partiton': expected name, partitions, configs"),
])
async def test_a_bad_topic_body_is_refused_naming_the_problem_and_reaches_nothing(
        console: Console, data: str | bytes, content_type: str, status: int, says: str) -> None:
    got, answer, _ = await console.ask("POST", "/api/topics", data=data, headers={"Content-Type": content_type})
    assert got == status and says in answer["error"], answer
    assert console.view.calls == []


@pytest.mark.parametrize("name", [None, 123, True, ["orders"]])
@pytest.mark.parametrize(("path", "body", "field"), [
    ("/api/topics", {"partitions": 1}, "name"),
    ("/api/groups/billing/reset-offsets", {"to": "earliest"}, "topic"),
    ("/api/placement/move", {"partition": 0, "shard": 1}, "topic"),
])
async def test_a_topic_name_that_is_not_a_string_is_refused(console: Console, name: object, path: str,
                                                            body: dict[str, Any], field: str) -> None:
    """`{"name": null}` must not create a topic called "None" (nor 123 one called "123")."""
    got, answer, _ = await console.ask("POST", path, {**body, field: name})
    assert got == 400 and "name" in answer["error"], answer
    assert console.view.calls == []


@pytest.mark.parametrize("body", [{"principal": None, "operation": "READ"}, {"principal": "User:bob", "host": 7}])
async def test_an_acl_field_that_is_not_a_string_is_refused(console: Console, body: dict[str, Any]) -> None:
    got, answer, _ = await console.ask("POST", "/api/acls", {"resource_type": "TOPIC", "resource_name": "t", **body})
    assert got == 400 and "expected a string" in answer["error"], answer
    assert console.view.calls == []


@pytest.mark.parametrize(("data", "content_type"), [
    ('{"name": "t", "partitions": ' + "1" * 5000 + "}", "application/json"),  # past Python's int-digit limit
    ("[" * 100_000 + "]" * 100_000, "application/json"),  # deeper than the parser's recursion
    ('{"name": "t"}', "application/json; charset=no-such-charset"),
])
async def test_a_body_the_json_parser_cannot_read_gets_a_4xx_not_a_500(console: Console, data: str,
                                                                      content_type: str) -> None:
    """Input the client got wrong is the client's error (400/415), not "internal error: see the broker's log"."""
    got, answer, _ = await console.ask("POST", "/api/topics", data=data, headers={"Content-Type": content_type})
    assert 400 <= got < 500 and "internal error" not in answer["error"], (got, answer)
    assert console.view.calls == []


@pytest.mark.parametrize(("path", "call"), [
    ("/api/topics/orders", ("delete_topic", ("orders",), {})),
    ("/api/groups/billing", ("delete_group", ("billing",), {})),
    ("/api/users/alice", ("delete_user", ("alice", "SCRAM-SHA-256"), {})),
])
async def test_deleting_needs_the_name_again_and_then_reaches_the_view_once(console: Console, path: str,
                                                                             call: Call) -> None:
    name = path.rsplit("/", 1)[1]
    for query in ("", "?confirm=", f"?confirm={name[:-1]}", f"?confirm={name.upper()}", f"?confirm={name}x"):
        got, answer, _ = await console.ask("DELETE", path + query)
        assert got == 400 and answer["error"].endswith(f"{name!r} needs ?confirm={name}"), (query, answer)
    assert console.view.calls == []
    assert (await console.ask("DELETE", f"{path}?confirm={name}"))[:2] == (200, {"deleted": name})
    assert console.view.calls == [call]


async def test_a_console_error_from_the_view_keeps_its_status_and_message(console: Console) -> None:
    assert (await console.ask("GET", "/api/topics/missing"))[:2] == (404, {"error": "topic 'missing' does not exist"})
    console.view.fails = ConsoleError(409, "create 'orders': TOPIC_ALREADY_EXISTS")
    got = await console.ask("POST", "/api/topics", {"name": "orders"})
    assert got[:2] == (409, {"error": "create 'orders': TOPIC_ALREADY_EXISTS"})


async def test_any_other_failure_of_the_view_is_a_500_that_shows_nothing_of_it(console: Console,
                                                                              caplog: pytest.LogCaptureFixture) -> None:
    console.view.fails = RuntimeError("connect to 10.0.0.7 with password=hunter2 failed")
    with caplog.at_level(logging.ERROR, logger="kafscale.console.api"):
        for method, path, body in (("GET", "/api/topics", None), ("POST", "/api/topics", {"name": "t"}),
                                   ("GET", "/api/overview", None)):
            async with console.client.request(method, path, json=body, headers={CSRF_HEADER: console.csrf}) as r:
                text = await r.text()
                assert r.status == 500 and await r.json() == {"error": "internal error: see the broker's log"}
                assert "hunter2" not in text and "RuntimeError" not in text
    assert "hunter2" in caplog.text  # it is in the broker's log, as the answer says


@pytest.mark.parametrize(("path", "says"), [
    ("/api/topics/orders/partitions/0/messages?limit=501", "limit: 501 is out of range (1..500)"),
    ("/api/topics/orders/partitions/0/messages?limit=0", "limit: 0 is out of range (1..500)"),
    ("/api/topics/orders/partitions/0/messages?offset=ten", "offset: expected an integer, got 'ten'"),
    ("/api/topics/orders/partitions/0/messages?offset=-1", "offset: -1 is out of range"),
    ("/api/topics/orders/partitions/0/messages?offset=" + "9" * 19, "is out of range (0..9223372036854775807)"),
    ("/api/topics/orders/partitions/0/messages?timestamp=soon", "timestamp: expected an integer, got 'soon'"),
    ("/api/topics/orders/partitions/0/messages?offset=1&timestamp=2", "give offset or timestamp, not both"),
    ("/api/topics/orders/partitions/-1/messages", "partition: -1 is out of range (0..2147483647)"),
    ("/api/topics/orders/partitions/2147483648/messages", "partition: 2147483648 is out of range"),
    ("/api/topics/orders/partitions/first/messages", "partition: expected an integer, got 'first'"),
    ("/api/topics/bad%20name/partitions/0/messages", "topic name 'bad name' is invalid"),
])
async def test_a_bad_messages_request_gets_a_400_and_reaches_nothing(console: Console, path: str, says: str) -> None:
    got, answer, _ = await console.ask("GET", path)
    assert got == 400 and says in answer["error"], answer
    assert console.view.calls == []


async def test_a_good_messages_request_passes_offset_timestamp_and_limit_through(console: Console) -> None:
    got, page, _ = await console.ask("GET", "/api/topics/orders/partitions/1/messages?offset=10&limit=5")
    assert got == 200 and page == {"topic": "orders", "partition": 1, "start": 10, "latest": 30, "messages": [
        {"partition": 1, "offset": 10, "timestamp": 1_700_000_000_000, "timestamp_type": "CreateTime", "key": "azE=",
         "value": None, "headers": [{"key": "origin", "value": "dGVzdA=="}], "truncated": False}]}
    assert (await console.ask("GET", "/api/topics/orders/partitions/0/messages?timestamp=1700000000000"))[0] == 200
    assert (await console.ask("GET", "/api/topics/orders/partitions/0/messages?limit=500"))[0] == 200
    assert console.view.calls == [
        ("messages", ("orders", 1), {"offset": 10, "timestamp": None, "limit": 5}),
        ("messages", ("orders", 0), {"offset": None, "timestamp": 1_700_000_000_000, "limit": 50}),
        ("messages", ("orders", 0), {"offset": None, "timestamp": None, "limit": 500})]


@pytest.mark.parametrize(("body", "says"), [
    ({"topic": "orders", "to": "yesterday"}, "to: expected earliest, latest, offset or timestamp"),
    ({"topic": "orders", "to": ["earliest"]}, "to: expected earliest, latest, offset or timestamp"),
    ({"topic": "orders", "to": "offset"}, "offset: a value is needed"),
    ({"topic": "orders", "to": "offset", "value": -1}, "offset: -1 is out of range"),
    ({"topic": "orders", "to": "offset", "value": True}, "offset: expected an integer, got True"),
    ({"topic": "orders", "to": "timestamp", "value": "soon"}, "timestamp: expected an integer, got 'soon'"),
    ({"topic": "orders", "to": "timestamp", "value": 2**63}, "timestamp: 9223372036854775808 is out of range"),
    ({"topic": "bad name", "to": "earliest"}, "topic name 'bad name' is invalid"),
    ({"to": "earliest"}, "topic name None is invalid"),
])
async def test_a_bad_offset_reset_is_refused_and_reaches_nothing(console: Console, body: dict[str, Any],
                                                                 says: str) -> None:
    got, answer, _ = await console.ask("POST", "/api/groups/billing/reset-offsets", body)
    assert got == 400 and says in answer["error"], answer
    assert console.view.calls == []


@pytest.mark.parametrize(("body", "passed"), [
    ({"topic": "orders", "to": "earliest", "value": 7}, ("earliest", None)),  # a value only for offset/timestamp
    ({"topic": "orders", "to": "latest"}, ("latest", None)),
    ({"topic": "orders", "to": "offset", "value": 12}, ("offset", 12)),
    ({"topic": "orders", "to": "timestamp", "value": "1700000000000"}, ("timestamp", 1_700_000_000_000)),
])
async def test_a_good_offset_reset_is_passed_through(console: Console, body: dict[str, Any],
                                                     passed: tuple[str, int | None]) -> None:
    got, answer, _ = await console.ask("POST", "/api/groups/billing/reset-offsets", body)
    value = passed[1] or 0
    assert got == 200 and answer == {"group": "billing", "offsets": [
        {"topic": "orders", "partition": 0, "committed": value, "latest": 30, "lag": 30 - value}]}
    assert console.view.calls == [("reset_offsets", ("billing", "orders", *passed), {})]


CHANGES = [
    ("POST", "/api/topics", {"name": "t", "partitions": 1}),
    ("PATCH", "/api/topics/orders/configs", {"set": {"retention.ms": "1"}}),
    ("DELETE", "/api/topics/orders?confirm=orders", None),
    ("POST", "/api/topics/orders/messages", {"value": "x"}),
    ("POST", "/api/groups/billing/reset-offsets", {"topic": "orders", "to": "earliest"}),
    ("DELETE", "/api/groups/billing?confirm=billing", None),
    ("POST", "/api/users", {"name": "bob", "password": "pw"}),
    ("DELETE", "/api/users/alice?confirm=alice", None),
    ("POST", "/api/acls", {"principal": "User:bob"}),
    ("POST", "/api/acls/delete?confirm=User:bob", {"principal": "User:bob"}),
    ("POST", "/api/placement/move", {"topic": "orders", "partition": 0, "shard": 1}),
    ("POST", "/api/placement/drain", {"node": "n1"}),
    ("POST", "/api/logout", None),
]
READS = ["/api/overview", "/api/topics", "/api/topics/orders", "/api/topics/orders/partitions/0/messages",
         "/api/groups", "/api/groups/billing", "/api/users", "/api/acls"]


@pytest.mark.parametrize(("method", "path", "body"), CHANGES)
async def test_a_change_without_the_sessions_csrf_token_gets_403_and_reaches_nothing(
        console: Console, method: str, path: str, body: Any) -> None:
    others = console.api.sessions.open(USER).csrf  # another session's token is no better than none
    for headers in ({}, {CSRF_HEADER: ""}, {CSRF_HEADER: "forged"}, {CSRF_HEADER: others}):
        got, answer, _ = await console.ask(method, path, body, headers=headers, csrf=False)
        assert (got, answer) == (403, {"error": "missing or wrong CSRF token: reload the page"}), headers
    assert console.view.calls == []
    assert (await console.ask("GET", "/api/topics"))[0] == 200  # not even a logout got through


@pytest.mark.parametrize("path", READS)
async def test_a_read_without_a_session_gets_401_and_reaches_nothing(console: Console, path: str) -> None:
    console.client.session.cookie_jar.clear()
    for cookies in ({}, {COOKIE: "forged"}):
        async with console.client.get(path, cookies=cookies) as r:
            assert r.status == 401, cookies
            assert await r.json() == {"error": "not logged in, or the session expired: log in again"}
    assert console.view.calls == []


async def test_security_headers_are_on_every_api_answer_errors_included(console: Console) -> None:
    answers = [await console.ask("GET", "/api/topics"), await console.ask("GET", "/api/topics/missing"),
               await console.ask("GET", "/api/topics/bad%20name"), await console.ask("GET", "/api/no-such-route"),
               await console.ask("POST", "/api/topics", {"name": "t"}, csrf=False)]
    console.view.fails = RuntimeError("boom")
    answers.append(await console.ask("GET", "/api/groups"))
    console.client.session.cookie_jar.clear()
    answers.append(await console.ask("GET", "/api/topics"))
    assert [status for status, _, _ in answers] == [200, 404, 400, 404, 403, 500, 401]
    for _, _, headers in answers:
        assert {k: headers.get(k) for k in SECURITY_HEADERS} == SECURITY_HEADERS
