"""SaslHandshake v0-v1: the client names a SASL mechanism; the answer lists the enabled ones.

Answered at once (no task): the connection must know the outcome before the client's next frame, which for v0 is
a bare SASL token, not a Kafka request (KIP-43's framing; v1 tokens travel in SaslAuthenticate). On a listener
without SASL it is ILLEGAL_SASL_STATE, as Kafka answers; an unknown mechanism or a handshake in the middle of an
exchange is answered, then the connection closes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.acceptor.handlers.common import make, response_module
from kafscale.acceptor.router import RequestContext
from kafscale.broker.interface import Broker

API_KEY, MIN_VERSION, MAX_VERSION = 17, 0, 1
log = logging.getLogger(__name__)


def handle(broker: Broker, ctx: RequestContext, req: Any) -> asyncio.Future[Any]:
    answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    answer.set_result(_answer(ctx, req.mechanism))
    return answer


def _answer(ctx: RequestContext, mechanism: str) -> Any:
    cls = response_module(ctx).SaslHandshakeResponse
    session = ctx.sasl
    if session is None:
        return make(cls, error_code=ErrorCode.illegal_sasl_state, mechanisms=())
    enabled = session.settings.mechanisms
    if session.in_exchange:
        session.failed = True
        log.warning("%s:%d: SaslHandshake in the middle of an exchange; closing", ctx.client_host, ctx.client_port)
        return make(cls, error_code=ErrorCode.illegal_sasl_state, mechanisms=enabled)
    if not session.handshake(mechanism):
        session.failed = True
        log.warning("%s:%d: SASL mechanism %r is not enabled (%s); closing", ctx.client_host, ctx.client_port,
                    mechanism[:64], ", ".join(enabled))
        return make(cls, error_code=ErrorCode.unsupported_sasl_mechanism, mechanisms=enabled)
    session.raw_tokens = ctx.api_version == 0
    return make(cls, error_code=ErrorCode.none, mechanisms=enabled)
