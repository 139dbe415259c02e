"""DescribeAcls v0-v3: the stored ACL bindings a filter matches, grouped by resource pattern (KIP-290 patterns
from v1; v0 filters and answers LITERAL patterns). Needs DESCRIBE on the cluster; without an authorizer it
answers SECURITY_DISABLED, as Kafka does."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed_on_cluster, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.security.acl import AclError, AclFilter, Operation, PatternType, Permission, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 29, 0, 3


def read_filter(f: Any) -> AclFilter:
    """DescribeAcls' filter, and each of DeleteAcls' (v0 has no pattern type: LITERAL)."""
    try:
        return AclFilter(ResourceType(f.resource_type_filter), f.resource_name_filter,
                         PatternType(getattr(f, "pattern_type_filter", PatternType.LITERAL)), f.principal_filter,
                         f.host_filter, Operation(f.operation), Permission(f.permission_type)).check()
    except ValueError as e:
        raise AclError(str(e)) from None


def refusal(broker: Broker, ctx: RequestContext, operation: Operation) -> tuple[ErrorCode, str | None] | None:
    """Why an ACL API is refused (no authorizer; the principal may not `operation` the cluster), or None."""
    if broker.acls.authorizer is None:
        return ErrorCode.security_disabled, "No Authorizer is configured on the broker"
    if not allowed_on_cluster(broker, ctx, operation):
        return ErrorCode.cluster_authorization_failed, f"Cluster authorization failed: {operation.name} on the cluster"
    return None


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)

    def answer(code: ErrorCode, message: str | None = None, resources: tuple[Any, ...] = ()) -> Any:
        return make(mod.DescribeAclsResponse, throttle_time=NO_THROTTLE, error_code=code, error_message=message,
                    resources=resources)

    refused = refusal(broker, ctx, Operation.DESCRIBE)
    if refused is not None:
        return answer(*refused)
    try:
        wanted = read_filter(req)
    except AclError as e:
        return answer(ErrorCode.invalid_request, str(e))
    by_pattern: dict[tuple[int, str, int], list[Any]] = {}
    for b in await broker.acls.stored():
        if wanted.matches(b) and (ctx.api_version >= 1 or b.pattern_type == PatternType.LITERAL):
            by_pattern.setdefault((b.resource_type, b.name, b.pattern_type), []).append(make(
                mod.AclDescription, principal=b.principal, host=b.host, operation=b.operation,
                permission_type=b.permission))
    resources = tuple(make(mod.DescribeAclsResource, resource_type=t, resource_name=n, pattern_type=p, acls=tuple(a))
                      for (t, n, p), a in sorted(by_pattern.items()))
    return answer(ErrorCode.none, None, resources)
