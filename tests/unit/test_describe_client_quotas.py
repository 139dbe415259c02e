"""DescribeClientQuotas (key 48) alone, against the fake broker: Kafscale has no quotas, so a valid filter matches
nothing, and a filter Kafka refuses is refused with Kafka's error and message (compared with Apache Kafka 4.4.0 on
the wire when the handler was written). Kafka's `kafka-configs.sh --describe --entity-type users` needs it:
tests/jvm/test_kafka_tools.py runs that tool."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kafscale.acceptor.handlers import describe_client_quotas
from kafscale.protocol.codec import make, request_class
from kafscale.protocol.errors import ErrorCode
from kafscale.security.acl import Authorizer
from tests.unit.fake_broker import context, fake_broker


def ask(version: int, *components: tuple[str, int, str | None]) -> object:
    cls = request_class(48, version)
    component = sys.modules[cls.__module__].ComponentData
    return make(cls, strict=False, components=tuple(make(component, entity_type=t, match_type=m, match=s)
                                                    for t, m, s in components))


@pytest.mark.parametrize("version", [0, 1])
async def test_a_valid_filter_matches_no_quota(tmp_path: Path, version: int) -> None:
    async with fake_broker(tmp_path) as broker:
        for components in [(), (("user", 0, "alice"),), (("user", 1, None),),
                           (("user", 2, None), ("client-id", 0, "app")), (("ip", 2, None),)]:
            answer = await describe_client_quotas.handle(broker, context(48, version), ask(version, *components))
            assert (answer.error_code, answer.error_message, answer.entries) == (ErrorCode.none, "", ()), components


@pytest.mark.parametrize(("components", "error", "message"), [
    ([("user", 0, "a"), ("user", 2, None)], ErrorCode.invalid_request,
     "Entity type user cannot appear more than once in the filter."),
    ([("ip", 2, None), ("user", 2, None)], ErrorCode.invalid_request,
     "Invalid entity filter component combination. IP filter component should not be used with user or clientId "
     "filter component."),
    ([("", 2, None)], ErrorCode.invalid_request, "Invalid empty entity type."),
    ([("user", 0, None)], ErrorCode.invalid_request,
     "Request specified MATCH_TYPE_EXACT, but set match string to null."),
    ([("user", 1, "x")], ErrorCode.invalid_request,
     "Request specified MATCH_TYPE_DEFAULT, but also specified a match string."),
    ([("user", 2, "x")], ErrorCode.invalid_request,
     "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string."),
    ([("user", 7, None)], ErrorCode.invalid_request, "Unknown match type 7"),
    ([("topic", 2, None)], ErrorCode.unsupported_version, "Unsupported entity type topic"),
])
async def test_a_filter_kafka_refuses_is_refused_alike(tmp_path: Path, components: list[tuple[str, int, str | None]],
                                                      error: ErrorCode, message: str) -> None:
    async with fake_broker(tmp_path) as broker:
        answer = await describe_client_quotas.handle(broker, context(48, 1), ask(1, *components))
        assert (answer.error_code, answer.error_message, answer.entries) == (error, message, None)


async def test_without_describe_configs_on_the_cluster_it_is_refused(tmp_path: Path) -> None:
    async with fake_broker(tmp_path) as broker:
        broker.acls.authorizer = Authorizer([])  # an authorizer and no ACL: nothing is allowed
        answer = await describe_client_quotas.handle(broker, context(48, 1), ask(1))
        assert (answer.error_code, answer.entries) == (ErrorCode.cluster_authorization_failed, None)
