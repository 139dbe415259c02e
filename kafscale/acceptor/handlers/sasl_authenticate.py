"""SaslAuthenticate v0-v2: one step of the mechanism's exchange (KIP-152). When it completes, the connection runs
as the principal it proved, for the session lifetime the answer gives (v1+, KIP-368: the client re-authenticates
before it ends, or the connection closes at its next request).

A failure is answered with SASL_AUTHENTICATION_FAILED after the throttle's delay, then the connection closes. The
log names the address and the mechanism, never what the client sent.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor import sasl_gate
from kafscale.acceptor.handlers.common import make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker
from kafscale.security.sasl import AuthFailed

API_KEY, MIN_VERSION, MAX_VERSION = 36, 0, 2
log = logging.getLogger(__name__)


async def handle(broker: Broker, ctx: RequestContext, req: Any) -> Any:
    cls = response_module(ctx).SaslAuthenticateResponse
    session = ctx.sasl
    if session is None or not session.in_exchange:
        if session is not None:
            session.failed = True
        return _answer(ctx, cls, ErrorCode.illegal_sasl_state, "SaslAuthenticate without a SaslHandshake before it")
    mechanism = session.mechanism
    try:
        step = await session.authenticate(bytes(req.auth_bytes))
    except AuthFailed as e:
        await sasl_gate.refuse(session, e, ctx.listener.auth_failures, ctx.client_host,
                               f"{ctx.client_host}:{ctx.client_port}", ctx.listener.on_closed)
        return _answer(ctx, cls, ErrorCode.sasl_authentication_failed, str(e))
    if step.done:
        log.info("%s:%d: authenticated as %s (SASL %s)", ctx.client_host, ctx.client_port, session.principal,
                 mechanism)
    return _answer(ctx, cls, ErrorCode.none, None, step.data, step.lifetime_ms)


def _answer(ctx: RequestContext, cls: Any, error: ErrorCode, message: str | None, data: bytes = b"",
            lifetime_ms: int = 0) -> Any:
    fields: dict[str, Any] = {"error_code": error, "error_message": message, "auth_bytes": data}
    if ctx.api_version >= 1:
        fields["session_lifetime"] = datetime.timedelta(milliseconds=lifetime_ms)
    return make(cls, **fields)
