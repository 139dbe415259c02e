"""DescribeUserScramCredentials v0: which SCRAM mechanisms (and iteration counts) each user has; never a salt or
a key. No names: every user with a credential. A named user without one is RESOURCE_NOT_FOUND, a name given
twice DUPLICATE_RESOURCE, as Kafka answers."""

from __future__ import annotations

from collections import Counter
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed_on_cluster, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.security.acl import Operation

API_KEY, MIN_VERSION, MAX_VERSION = 50, 0, 0


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    if not allowed_on_cluster(broker, ctx, Operation.DESCRIBE):
        # As Kafka answers: the error, and again for each user asked about.
        denied = "Cluster authorization failed."
        return make(mod.DescribeUserScramCredentialsResponse, throttle_time=NO_THROTTLE,
                    error_code=ErrorCode.cluster_authorization_failed, error_message=denied, results=tuple(
                        make(mod.DescribeUserScramCredentialsResult, user=u.name,
                             error_code=ErrorCode.cluster_authorization_failed, error_message=denied,
                             credential_infos=()) for u in req.users or ()))
    stored = await broker.credentials.stored()
    names = [u.name for u in req.users] if req.users else sorted(stored)
    counts = Counter(names)
    results = []
    for name in dict.fromkeys(names):
        if counts[name] > 1:
            results.append(make(mod.DescribeUserScramCredentialsResult, user=name,
                                error_code=ErrorCode.duplicate_resource,
                                error_message=f"Cannot describe SCRAM credentials for the same user twice in a "
                                              f"single request: {name}", credential_infos=()))
        elif name not in stored:
            results.append(make(mod.DescribeUserScramCredentialsResult, user=name,
                                error_code=ErrorCode.resource_not_found,
                                error_message=f"Attempt to describe nonexistent user {name}", credential_infos=()))
        else:
            infos = tuple(make(mod.CredentialInfo, mechanism=m.kafka_type, iterations=c.iterations)
                          for m, c in sorted(stored[name].items(), key=lambda mc: mc[0].kafka_type))
            results.append(make(mod.DescribeUserScramCredentialsResult, user=name, error_code=ErrorCode.none,
                                error_message=None, credential_infos=infos))
    return make(mod.DescribeUserScramCredentialsResponse, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                error_message=None, results=tuple(results))
