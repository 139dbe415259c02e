"""What a connection on a SASL listener may send, and the bare tokens of KIP-43's framing.

Before authentication completes only ApiVersions, SaslHandshake and SaslAuthenticate are taken; any other request
closes the connection (as Kafka does). Once a session has expired (KIP-368, connections.max.reauth.ms) only a
re-authentication is. After a v0 SaslHandshake the client's next frames are bare SASL tokens, answered as bare
tokens, until the exchange completes; a failure there has no answer: the connection closes after the throttle's
delay.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from kafscale.security.sasl import AuthFailed, SaslSession
from kafscale.security.throttle import FailureThrottle

log = logging.getLogger("kafscale.acceptor.listener")  # the listener's logger: one place for a connection's story

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36


def admits(session: SaslSession, api_key: int, api_version: int, who: object) -> bool:
    """May this request be taken now (False: close the connection)? `who` names the connection in the log."""
    if api_key in (API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE):
        return True
    if not session.authenticated:
        log.warning("%s: API key %d v%d before SASL authentication completed; closing", who, api_key, api_version)
        return False
    if session.expired():
        log.info("%s: SASL session of %s expired without re-authentication; closing", who, session.principal)
        return False
    return True


async def refuse(session: SaslSession, error: AuthFailed, throttle: FailureThrottle, host: str, who: object,
                 on_closed: Callable[[str], None]) -> None:
    """A failed authentication: the connection closes after its answer, which waits out the throttle's delay
    for this address; counted and logged (never what the client sent)."""
    session.failed = True
    delay = throttle.failed(host)
    on_closed("sasl_authentication_failed")
    log.warning("%s: SASL %s authentication failed (%s); answering in %.1f s, then closing", who, session.mechanism,
                error, delay)
    await asyncio.sleep(delay)


async def token_step(session: SaslSession, token: bytes, throttle: FailureThrottle, host: str, who: object,
                     on_closed: Callable[[str], None]) -> bytes | None:
    """One bare token (after a v0 SaslHandshake): the framed answer, or None after a failure."""
    mechanism = session.mechanism
    try:
        step = await session.authenticate(token)
    except AuthFailed as e:
        await refuse(session, e, throttle, host, who, on_closed)
        return None  # KIP-43's framing has no error answer: the connection closes
    if step.done:
        session.raw_tokens = False
        log.info("%s: authenticated as %s (SASL %s)", who, session.principal, mechanism)
    return len(step.data).to_bytes(4, "big") + step.data
