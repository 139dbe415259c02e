"""The console in a real browser: Debian's headless Chromium driven by Playwright, against an in-process broker.

The tests log in (and are refused), then check that each page shows what clients did, and run one action per
page. Screenshots of each page are kept in build/test-artefacts/console/ (not committed).
"""

from __future__ import annotations

import json
import time

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from playwright.sync_api import Page, expect

from kafscale.console.server import ConsoleServer
from kafscale.testing.console import console_beside, stop_console
from tests.integration.conftest import Cluster, unique_topic, wait_until
from tests.integration.console.conftest import PASSWORD, USER, log_in, make_topic, produce, shot


def test_the_login_page_refuses_a_wrong_password_and_says_when_access_is_disabled(
        page: Page, console: ConsoleServer, broker_embedded: Cluster) -> None:
    log_in(page, console, "wrong")
    expect(page.locator("#login-error")).to_have_text("wrong username or password")
    expect(page.locator("#app")).to_be_hidden()
    shot(page, "login-refused")

    disabled = console_beside(broker_embedded.broker, {})
    try:
        page.goto(disabled.url)
        expect(page.locator("#login-disabled")).to_contain_text(
            "UI access is disabled: KAFSCALE_UI_USERNAME and KAFSCALE_UI_PASSWORD are not set")
        page.fill("#username", USER)
        page.fill("#password", PASSWORD)
        page.click("#login-button")
        expect(page.locator("#login-error")).to_contain_text("UI access is disabled")
        expect(page.locator("#app")).to_be_hidden()
        shot(page, "login-disabled")
    finally:
        stop_console(broker_embedded.broker, disabled)


def test_overview_and_topics_show_what_a_client_made_and_a_topic_is_created(
        page: Page, console: ConsoleServer, broker_embedded: Cluster) -> None:
    topic = unique_topic("browser-topic")
    make_topic(broker_embedded.bootstrap, topic, 3)
    produce(broker_embedded.bootstrap, topic, [(b"k%d" % i, b"v%d" % i) for i in range(7)])
    log_in(page, console)
    expect(page.get_by_test_id("shard-count")).to_have_text("1/1")
    expect(page.get_by_test_id("shards")).to_contain_text(f"127.0.0.1:{broker_embedded.port}")
    shot(page, "overview")

    page.click("nav >> text=Topics")
    row = page.get_by_test_id("topics").locator("tr", has_text=topic)
    expect(row).to_contain_text("3")
    expect(row.locator("td").nth(2)).to_have_text("7")
    shot(page, "topics")

    made = unique_topic("browser-made")
    page.get_by_test_id("new-topic-name").fill(made)
    page.get_by_test_id("new-topic-partitions").fill("4")
    page.get_by_role("button", name="Create topic").click()
    expect(page.locator("#flash")).to_have_text(f"created topic {made}")
    expect(page.get_by_test_id("topics").locator("tr", has_text=made)).to_contain_text("4")


def test_a_topics_messages_show_decoded_and_a_test_message_is_produced(
        page: Page, console: ConsoleServer, broker_embedded: Cluster) -> None:
    topic = unique_topic("browser-messages")
    make_topic(broker_embedded.bootstrap, topic, 1)
    produce(broker_embedded.bootstrap, topic, [(b"user-1", json.dumps({"name": "ada", "n": 1}).encode())])
    log_in(page, console)
    page.goto(console.url + f"#/topics/{topic}")
    expect(page.get_by_test_id("partitions")).to_contain_text("0")
    page.get_by_test_id("browse").get_by_role("button", name="Read").click()
    messages = page.get_by_test_id("messages")
    expect(messages).to_contain_text("user-1")
    expect(messages).to_contain_text('{"name": "ada", "n": 1}')
    page.get_by_test_id("decode").select_option("json")
    expect(messages).to_contain_text('"name": "ada"')
    page.get_by_test_id("decode").select_option("hex")
    expect(messages).to_contain_text("75 73 65 72 2d 31")  # "user-1"
    shot(page, "messages")

    page.get_by_test_id("produce-key").fill("from-browser")
    page.get_by_test_id("produce-value").fill("hello from the console")
    page.get_by_test_id("produce").get_by_role("button", name="Produce").click()
    expect(page.locator("#flash")).to_have_text("produced to partition 0 at offset 1")
    c = Consumer({"bootstrap.servers": broker_embedded.bootstrap, "group.id": unique_topic("b")})
    try:
        c.assign([TopicPartition(topic, 0, 1)])
        msg = wait_until(lambda: c.poll(1.0), what="the browser's message")
        assert (msg.key(), msg.value()) == (b"from-browser", b"hello from the console")
    finally:
        c.close()


def test_a_virtual_topics_page_says_it_is_virtual_and_sizes_need_the_controller(
        page: Page, console: ConsoleServer, broker_embedded: Cluster) -> None:
    """Beside an in-process broker (no controller) the console knows a topic is virtual from its config only,
    and has no sizes (kafscale serve's console shows both: test_serve.py)."""
    topic = unique_topic("browser-virtual")
    admin = AdminClient({"bootstrap.servers": broker_embedded.bootstrap})  # held until the answer
    admin.create_topics([NewTopic(topic, 2, config={"kafscale.virtual.partitions": "6"})])[topic].result(30)
    log_in(page, console)
    page.goto(console.url + f"#/topics/{topic}")
    expect(page.get_by_test_id("virtual-layout")).to_contain_text("Virtual partitions: 6")
    expect(page.get_by_test_id("partitions").locator("tbody tr")).to_have_count(6)
    expect(page.get_by_test_id("topic-size")).to_have_text("-")
    shot(page, "virtual-topic")


def test_the_placement_page_shows_what_leads_what_and_a_move_needs_the_controller(
        page: Page, console: ConsoleServer, broker_embedded: Cluster) -> None:
    topic = unique_topic("browser-placement")
    make_topic(broker_embedded.bootstrap, topic, 2)
    log_in(page, console)
    page.click("nav >> text=Placement")
    expect(page.get_by_test_id("placement")).to_contain_text(f"{topic}-1")
    shot(page, "placement")
    page.get_by_test_id("move-topic").fill(topic)
    page.get_by_test_id("move-shard").fill("0")
    page.get_by_test_id("move").get_by_role("button", name="Move").click()
    # This broker runs without kafscale serve's controller (test_serve.py moves one through it).
    expect(page.locator("#flash")).to_have_text(
        "moving partitions needs kafscale serve's controller, which this broker lacks")


def test_a_groups_lag_shows_after_its_consumer_stops_and_its_offsets_reset(
        page: Page, console: ConsoleServer, broker_embedded: Cluster) -> None:
    topic, group = unique_topic("browser-group"), unique_topic("browser-g")
    make_topic(broker_embedded.bootstrap, topic, 1)
    produce(broker_embedded.bootstrap, topic, [(None, b"v%d" % i) for i in range(10)])
    c = Consumer({"bootstrap.servers": broker_embedded.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + 60
        while c.assignment() == [] and time.monotonic() < deadline:
            c.poll(0.5)
        c.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)
    finally:
        c.close()
    log_in(page, console)
    page.click("nav >> text=Consumer groups")
    expect(page.get_by_test_id("groups").locator("tr", has_text=group)).to_contain_text("EMPTY")
    shot(page, "groups")
    page.get_by_test_id("groups").get_by_role("link", name=group).click()
    expect(page.get_by_test_id("total-lag")).to_have_text("6")
    expect(page.get_by_test_id("offsets").locator("tr", has_text=topic)).to_contain_text("6")
    expect(page.get_by_test_id("lag-chart")).to_be_visible()
    shot(page, "group")

    page.get_by_test_id("reset-topic").fill(topic)
    page.get_by_test_id("reset-to").select_option("earliest")
    page.get_by_test_id("reset").get_by_role("button", name="Reset").click()
    expect(page.locator("#flash")).to_have_text(f"reset offsets of {group} on {topic}")
    expect(page.get_by_test_id("total-lag")).to_have_text("10")
