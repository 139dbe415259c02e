"""DeleteAcls v0-v3: remove every stored binding each filter matches, and say which (v0 filters LITERAL
patterns). Needs ALTER on the cluster; SECURITY_DISABLED without an authorizer. Every shard stops applying a
removed binding as soon as the metadata store's watch delivers it."""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, make, response_module
from kafscale.acceptor.handlers.describe_acls import read_filter, refusal
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.security.acl import AclError, Operation

API_KEY, MIN_VERSION, MAX_VERSION = 31, 0, 3
log = logging.getLogger(__name__)


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    results = []
    for f in req.filters:
        code, message, matching = ErrorCode.none, None, ()
        refused = refusal(broker, ctx, Operation.ALTER)
        if refused is not None:
            code, message = refused
        else:
            try:
                gone = await broker.acls.delete(read_filter(f))
                for b in gone:
                    log.info("ACL removed by %s: %s", ctx.principal, b)
                matching = tuple(make(mod.DeleteAclsMatchingAcl, error_code=ErrorCode.none, error_message=None,
                                      resource_type=b.resource_type, resource_name=b.name, pattern_type=b.pattern_type,
                                      principal=b.principal, host=b.host, operation=b.operation,
                                      permission_type=b.permission) for b in gone)
            except AclError as e:
                code, message = ErrorCode.invalid_request, str(e)
        results.append(make(mod.DeleteAclsFilterResult, error_code=code, error_message=message,
                            matching_acls=matching))
    return make(mod.DeleteAclsResponse, throttle_time=NO_THROTTLE, filter_results=tuple(results))
