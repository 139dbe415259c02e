"""AlterUserScramCredentials v0: add, replace or delete users' SCRAM credentials (how AdminClient and Kafka's
kafka-configs tool manage users). The client sends the salted password; the broker keeps only StoredKey and
ServerKey (kafscale.security.scram).

Per user, all or nothing, with Kafka's errors: UNSUPPORTED_SASL_MECHANISM for an unknown mechanism,
UNACCEPTABLE_CREDENTIAL for an empty name, an empty salt or password, or iterations outside 4096..16384,
DUPLICATE_RESOURCE for a user and mechanism named twice, RESOURCE_NOT_FOUND for deleting what is not there.
Every shard sees a change as soon as the metadata store's watch delivers it.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import NO_THROTTLE, allowed_on_cluster, make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.security.acl import Operation
from kafscale.security.scram import MAX_ITERATIONS, MIN_ITERATIONS, Mechanism, ScramCredential

API_KEY, MIN_VERSION, MAX_VERSION = 51, 0, 0
log = logging.getLogger(__name__)


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    mod = response_module(ctx)
    if not allowed_on_cluster(broker, ctx, Operation.ALTER):
        users = dict.fromkeys(op.name for op in (*req.deletions, *req.upsertions))
        return make(mod.AlterUserScramCredentialsResponse, throttle_time=NO_THROTTLE, results=tuple(
            make(mod.AlterUserScramCredentialsResult, user=u, error_code=ErrorCode.cluster_authorization_failed,
                 error_message=None) for u in users))
    stored = await broker.credentials.stored()
    twice = Counter((op.name, op.mechanism) for op in (*req.deletions, *req.upsertions))
    problems: dict[str, tuple[ErrorCode, str]] = {}
    for op in (*req.deletions, *req.upsertions):
        problem = _problem(op, twice, stored, upsert=hasattr(op, "salted_password"))
        if problem is not None and op.name not in problems:
            problems[op.name] = problem
    for op in req.deletions:
        if op.name not in problems:
            mechanism = Mechanism.of_type(op.mechanism)
            assert mechanism is not None
            await broker.credentials.delete(op.name, mechanism)
            log.info("SCRAM credential %s of user %s deleted by %s", mechanism.sasl_name, op.name, ctx.principal)
    for op in req.upsertions:
        if op.name not in problems:
            mechanism = Mechanism.of_type(op.mechanism)
            assert mechanism is not None
            credential = ScramCredential.from_salted_password(mechanism, bytes(op.salt), op.iterations,
                                                              bytes(op.salted_password))
            await broker.credentials.upsert(op.name, credential)
            log.info("SCRAM credential %s of user %s set by %s", mechanism.sasl_name, op.name, ctx.principal)
    users = dict.fromkeys(op.name for op in (*req.deletions, *req.upsertions))
    results = tuple(make(mod.AlterUserScramCredentialsResult, user=user,
                         error_code=problems[user][0] if user in problems else ErrorCode.none,
                         error_message=problems[user][1] if user in problems else None) for user in users)
    return make(mod.AlterUserScramCredentialsResponse, throttle_time=NO_THROTTLE, results=results)


def _problem(op: Any, twice: Counter[tuple[str, int]], stored: dict[str, dict[Mechanism, ScramCredential]],
             upsert: bool) -> tuple[ErrorCode, str] | None:
    mechanism = Mechanism.of_type(op.mechanism)
    if not op.name:
        return ErrorCode.unacceptable_credential, "Username must not be empty"
    if mechanism is None:
        return ErrorCode.unsupported_sasl_mechanism, f"Unknown SCRAM mechanism type {op.mechanism}"
    if twice[(op.name, op.mechanism)] > 1:
        return ErrorCode.duplicate_resource, f"A user credential cannot be altered twice in the same request: {op.name}"
    if not upsert:
        if mechanism not in stored.get(op.name, {}):
            return ErrorCode.resource_not_found, f"Attempt to delete a user credential that does not exist: {op.name}"
        return None
    if not MIN_ITERATIONS <= op.iterations <= MAX_ITERATIONS:
        return ErrorCode.unacceptable_credential, (f"Iterations must be in [{MIN_ITERATIONS}, {MAX_ITERATIONS}], "
                                                   f"got {op.iterations}")
    if not op.salt or not op.salted_password:
        return ErrorCode.unacceptable_credential, "Salt and salted password must not be empty"
    return None
