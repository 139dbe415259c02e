"""The console as one principal on a broker with SASL and ACLs (`--authorizer acl`): its Security page manages SCRAM
users and ACLs, and the cluster's ACLs decide what the console may see and change, as for any client."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka.admin import AclOperation, ResourceType
from playwright.sync_api import Page, expect

from kafscale.console.server import ConsoleServer
from kafscale.testing.console import stop_console
from kafscale.testing.inprocess import InProcessBroker
from tests.integration.console.conftest import console_as, log_in, logged_in, shot
from tests.integration.test_acls import allow, create_topic, grant, name, produce
from tests.integration.test_security import wait_for


def test_scram_users_are_listed_added_and_deleted(admin_console: ConsoleServer, acl_broker: InProcessBroker) -> None:
    s = logged_in(admin_console)
    users = {u["name"]: u["credentials"] for u in s.get(admin_console.url + "api/users", timeout=30).json()}
    assert users["alice"] == [{"mechanism": "SCRAM-SHA-256", "iterations": 4096}] and {"admin", "bob"} <= set(users)
    carol = name("carol")
    r = s.post(admin_console.url + "api/users", json={"name": carol, "password": "carol-pw",
                                                      "mechanism": "SCRAM-SHA-512", "iterations": 8192}, timeout=30)
    assert r.status_code == 201, r.text
    users = {u["name"]: u["credentials"] for u in s.get(admin_console.url + "api/users", timeout=30).json()}
    assert users[carol] == [{"mechanism": "SCRAM-SHA-512", "iterations": 8192}]
    # The password works: carol logs in to the broker with it.
    wait_for(lambda: acl_broker.shard.core.credentials.any_of(carol))  # type: ignore[union-attr]

    for bad, says in (({"name": carol, "password": "x", "mechanism": "MD5"}, "mechanism: expected SCRAM-SHA-256"),
                      ({"name": carol, "password": "x", "iterations": 100}, "iterations: 100 is out of range"),
                      ({"name": carol}, "password: expected a non-empty string")):
        r = s.post(admin_console.url + "api/users", json=bad, timeout=30)
        assert r.status_code == 400 and says in r.json()["error"]
    assert s.delete(admin_console.url + f"api/users/{carol}", timeout=30).status_code == 400  # not confirmed
    r = s.delete(admin_console.url + f"api/users/{carol}", params={"confirm": carol, "mechanism": "SCRAM-SHA-512"},
                 timeout=30)
    assert r.status_code == 200, r.text
    assert carol not in {u["name"] for u in s.get(admin_console.url + "api/users", timeout=30).json()}


def test_acls_are_listed_created_and_removed(admin_console: ConsoleServer) -> None:
    s = logged_in(admin_console)
    topic = name("console-acl-")
    entry = {"resource_type": "TOPIC", "resource_name": topic, "pattern_type": "LITERAL", "principal": "User:bob",
             "host": "*", "operation": "READ", "permission": "ALLOW"}
    assert s.post(admin_console.url + "api/acls", json=entry, timeout=30).status_code == 201
    second = {**entry, "operation": "DESCRIBE"}
    assert s.post(admin_console.url + "api/acls", json=second, timeout=30).status_code == 201
    listed = s.get(admin_console.url + "api/acls", timeout=30).json()
    assert entry in listed and second in listed and listed == sorted(listed, key=lambda e: tuple(e.values()))
    for bad, says in (({**entry, "principal": "bob"}, "principal: expected TYPE:NAME"),
                      ({**entry, "operation": "READ_ALL"}, "operation: expected one of"),
                      ({**entry, "resource_type": "BROKER"}, "resource_type: expected one of TOPIC")):
        r = s.post(admin_console.url + "api/acls", json=bad, timeout=30)
        assert r.status_code == 400 and says in r.json()["error"]
    unconfirmed = s.post(admin_console.url + "api/acls/delete", json=entry, timeout=30)
    assert unconfirmed.status_code == 400 and "?confirm=User:bob" in unconfirmed.json()["error"]
    removed = s.post(admin_console.url + "api/acls/delete", params={"confirm": "User:bob"}, json=entry, timeout=30)
    assert removed.status_code == 200 and removed.json() == {"deleted": 1}
    listed = s.get(admin_console.url + "api/acls", timeout=30).json()
    assert entry not in listed and second in listed


def test_the_console_sees_and_does_only_what_its_principals_acls_allow(acl_broker: InProcessBroker,
                                                                        tmp_path: Path) -> None:
    visible, hidden = name("console-seen-"), name("console-hidden-")
    create_topic(acl_broker, visible)
    create_topic(acl_broker, hidden)
    grant(acl_broker, allow(ResourceType.TOPIC, visible, AclOperation.DESCRIBE, user="bob"),
          allow(ResourceType.TOPIC, visible, AclOperation.READ, user="bob"))
    produce(acl_broker, "admin", visible, 3)
    console = console_as(acl_broker, "bob", tmp_path)
    try:
        s = logged_in(console)
        names = {t["name"] for t in s.get(console.url + "api/topics", timeout=30).json()}
        assert visible in names and hidden not in names
        refused = s.post(console.url + "api/topics", json={"name": name("console-made-"), "partitions": 1},
                         timeout=30)
        assert refused.status_code == 403 and "AUTHORIZATION_FAILED" in refused.json()["error"]
        # Reading needs READ on the topic only: the browsing consumer's group id is refused, and harmless.
        page = s.get(console.url + f"api/topics/{visible}/partitions/0/messages", timeout=60)
        assert page.status_code == 200, page.text
        assert [m["offset"] for m in page.json()["messages"]] == [0, 1, 2]
        hidden_page = s.get(console.url + f"api/topics/{hidden}/partitions/0/messages", timeout=60)
        assert hidden_page.status_code in (403, 404), hidden_page.text  # as Metadata hides it: unknown
        moved = s.post(console.url + "api/placement/move", json={"topic": visible, "partition": 0, "shard": 0},
                       timeout=30)
        assert moved.status_code == 403 and "may not ALTER the cluster" in moved.json()["error"]
        made = s.post(console.url + "api/acls", json={
            "resource_type": "TOPIC", "resource_name": visible, "pattern_type": "LITERAL", "principal": "User:bob",
            "host": "*", "operation": "WRITE", "permission": "ALLOW"}, timeout=30)
        assert made.status_code == 403 and "CLUSTER_AUTHORIZATION_FAILED" in made.json()["error"]
    finally:
        stop_console(acl_broker, console)


def test_the_security_page_lists_users_and_adds_an_acl(page: Page, admin_console: ConsoleServer) -> None:
    log_in(page, admin_console)
    page.click("nav >> text=Security")
    expect(page.get_by_test_id("users")).to_contain_text("alice")
    expect(page.get_by_test_id("users")).to_contain_text("SCRAM-SHA-256 (4096 iterations)")
    topic = name("browser-acl-")
    page.get_by_test_id("acl-resource").fill(topic)
    page.get_by_test_id("acl-principal").fill("User:alice")
    page.get_by_test_id("add-acl").get_by_role("button", name="Add ACL").click()
    expect(page.locator("#flash")).to_have_text("created the ACL")
    row = page.get_by_test_id("acls").locator("tr", has_text=topic)
    expect(row).to_contain_text("User:alice")
    expect(row).to_contain_text("READ")
    shot(page, "security")
    page.once("dialog", lambda d: d.accept())
    row.get_by_role("button", name="Remove").click()
    expect(page.locator("#flash")).to_have_text("removed the ACL")
    expect(page.get_by_test_id("acls").locator("tr", has_text=topic)).to_have_count(0)
