"""CreateAcls v0-v3: store ACL bindings (v0 creates LITERAL patterns). Needs ALTER on the cluster. Each creation
is answered on its own: INVALID_REQUEST for a binding that cannot be (an ANY or UNKNOWN field, a CLUSTER not named
kafka-cluster, a principal that is not TYPE:NAME), SECURITY_DISABLED without an authorizer. Every shard applies a
new binding as soon as the metadata store's watch delivers it."""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, make, response_module
from kafscale.acceptor.handlers.describe_acls import refusal
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.security.acl import AclBinding, AclError, Operation, PatternType, Permission, ResourceType

API_KEY, MIN_VERSION, MAX_VERSION = 30, 0, 3
log = logging.getLogger(__name__)


def read_binding(c: Any) -> AclBinding:
    try:
        return AclBinding(ResourceType(c.resource_type), c.resource_name,
                          PatternType(getattr(c, "resource_pattern_type", PatternType.LITERAL)), c.principal, c.host,
                          Operation(c.operation), Permission(c.permission_type)).check()
    except ValueError as e:
        raise AclError(str(e)) from None


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    results = []
    for creation in req.creations:
        code, message = ErrorCode.none, None
        refused = refusal(broker, ctx, Operation.ALTER)
        if refused is not None:
            code, message = refused
        else:
            try:
                binding = read_binding(creation)
                await broker.acls.create(binding)
                log.info("ACL added by %s: %s", ctx.principal, binding)
            except AclError as e:
                code, message = ErrorCode.invalid_request, str(e)
        results.append(make(mod.AclCreationResult, error_code=code, error_message=message))
    return make(mod.CreateAclsResponse, throttle_time=NO_THROTTLE, results=tuple(results))
