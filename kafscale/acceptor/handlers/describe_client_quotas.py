"""DescribeClientQuotas v0-v1: Kafscale has no client quotas, so a valid filter matches no entity (an empty list).

Kafka's `kafka-configs.sh --describe --entity-type users` asks it beside DescribeUserScramCredentials and fails
on a broker that lacks it. The filter is checked as Kafka's ClientQuotasImage.describe checks it, with its errors:
an empty or repeated entity type, an unknown match type, or an ip component beside a user or client-id one, is
INVALID_REQUEST; an entity type Kafka does not know is UNSUPPORTED_VERSION; a match string must be given for an
exact match and only then. Refused without DESCRIBE_CONFIGS on the cluster, as in Kafka. Answers carry Kafka's
error message, "" when there is no error (checked against Kafka 4.4.0 on the wire).
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed_on_cluster, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.security.acl import Operation

API_KEY, MIN_VERSION, MAX_VERSION = 48, 0, 1

USER, CLIENT_ID, IP = "user", "client-id", "ip"
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2


def filter_problem(components: Any) -> tuple[ErrorCode, str] | None:
    """Why Kafka refuses this filter, or None."""
    seen: set[str] = set()
    for c in components:
        kind, match_type = c.entity_type, int(c.match_type)
        if not kind:
            return ErrorCode.invalid_request, "Invalid empty entity type."
        if kind in seen:
            return ErrorCode.invalid_request, f"Entity type {kind} cannot appear more than once in the filter."
        if kind not in (IP, USER, CLIENT_ID):
            return ErrorCode.unsupported_version, f"Unsupported entity type {kind}"
        if match_type == MATCH_EXACT:
            if c.match is None:
                return ErrorCode.invalid_request, "Request specified MATCH_TYPE_EXACT, but set match string to null."
        elif match_type in (MATCH_DEFAULT, MATCH_SPECIFIED):
            if c.match is not None:
                name = "MATCH_TYPE_DEFAULT" if match_type == MATCH_DEFAULT else "MATCH_TYPE_SPECIFIED"
                return ErrorCode.invalid_request, f"Request specified {name}, but also specified a match string."
        else:
            return ErrorCode.invalid_request, f"Unknown match type {match_type}"
        seen.add(kind)
    if IP in seen and seen & {USER, CLIENT_ID}:
        return ErrorCode.invalid_request, ("Invalid entity filter component combination. IP filter component should "
                                           "not be used with user or clientId filter component.")
    return None


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    if not allowed_on_cluster(broker, ctx, Operation.DESCRIBE_CONFIGS):
        problem: tuple[ErrorCode, str] | None = (ErrorCode.cluster_authorization_failed,
                                                 "Cluster authorization failed.")
    else:
        problem = filter_problem(req.components)
    if problem is not None:
        return make(mod.DescribeClientQuotasResponse, throttle_time=NO_THROTTLE, error_code=problem[0],
                    error_message=problem[1], entries=None)
    return make(mod.DescribeClientQuotasResponse, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                error_message="", entries=())
