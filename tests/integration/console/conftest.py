"""The console's fixtures: a console beside the session's embedded broker, one beside a broker with SASL and ACLs,
Debian's Chromium driven by Playwright, and the helpers the three test modules share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from playwright.sync_api import Browser, Page, expect, sync_playwright

from kafscale.console.server import ConsoleServer
from kafscale.console.sessions import CSRF_HEADER
from kafscale.testing.console import chromium_path, console_beside, stop_console
from kafscale.testing.inprocess import InProcessBroker
from tests.integration.conftest import Cluster
from tests.integration.test_acls import USERS, acl_broker_in

USER, PASSWORD = "operator", "correct horse battery staple"
LOGIN_ENV = {"KAFSCALE_UI_USERNAME": USER, "KAFSCALE_UI_PASSWORD": PASSWORD}
SHOTS = Path(__file__).resolve().parents[3] / "build" / "test-artefacts" / "console"
WAIT_MS = 20_000
# Pages refresh every 5 s and some changes show only after the cluster has spread them (new ACLs reach the
# broker's authorizer through the metadata store's watch): a few refreshes' time, not Playwright's 5 s.
expect.set_options(timeout=WAIT_MS)


@pytest.fixture(scope="package")
def console(broker_embedded: Cluster) -> Iterator[ConsoleServer]:
    server = console_beside(broker_embedded.broker, LOGIN_ENV)
    yield server
    stop_console(broker_embedded.broker, server)


@pytest.fixture(scope="package")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    """test_acls' broker: SASL_PLAINTEXT with SCRAM, the ACL authorizer, super user User:admin, alice and bob."""
    with acl_broker_in(tmp_path_factory.mktemp("console-acl-broker")) as b:
        yield b


def console_as(broker: InProcessBroker, user: str, tmp: Path) -> ConsoleServer:
    """A console whose Kafka clients log in to the broker as `user` (console_client_config)."""
    properties = tmp / f"console-{user}.properties"
    properties.write_text(f"security.protocol=SASL_PLAINTEXT\nsasl.mechanisms=SCRAM-SHA-256\nsasl.username={user}\n"
                          f"sasl.password={USERS[user]}\n")
    return console_beside(broker, LOGIN_ENV, console_client_config=str(properties))


@pytest.fixture(scope="package")
def admin_console(acl_broker: InProcessBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleServer]:
    server = console_as(acl_broker, "admin", tmp_path_factory.mktemp("console"))
    yield server
    stop_console(acl_broker, server)


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        # --no-sandbox: the tests may run as root (CI containers), where Chromium's sandbox refuses to start.
        b = p.chromium.launch(executable_path=chromium_path(), headless=True, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context()
    p = context.new_page()
    p.set_default_timeout(WAIT_MS)
    try:
        yield p
    finally:
        context.close()


def logged_in(console: ConsoleServer) -> requests.Session:
    """An API session: the cookie, and the CSRF token on every request."""
    s = requests.Session()
    r = s.post(console.url + "api/login", json={"username": USER, "password": PASSWORD}, timeout=30)
    assert r.status_code == 200, r.text
    s.headers[CSRF_HEADER] = r.json()["csrf"]
    return s


def log_in(page: Page, console: ConsoleServer, password: str = PASSWORD) -> None:
    page.goto(console.url)
    page.fill("#username", USER)
    page.fill("#password", password)
    page.click("#login-button")


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes]], partition: int = 0) -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    for key, value in records:
        p.produce(topic, value, key, partition=partition, headers=[("origin", b"test")])
    assert p.flush(30) == 0


def make_topic(bootstrap: str, topic: str, partitions: int = 2) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held until the answer: a dropped client cancels it
    admin.create_topics([NewTopic(topic, partitions)])[topic].result(30)
