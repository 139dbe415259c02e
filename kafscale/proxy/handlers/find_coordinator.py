"""FindCoordinator: the upstream's coordinator is remembered, and the client is told the proxy is it."""

from __future__ import annotations

from typing import Any

from kafscale.protocol.codec import replace
from kafscale.proxy.state import Call

API_KEY, MIN_VERSION, MAX_VERSION = 10, 0, 3
GROUP = 0


async def handle(call: Call, request: Any) -> Any:
    answer = await call.session.send(request)
    if answer.error_code != 0:
        return answer
    call.proxy.cluster.brokers[answer.node_id] = (answer.host, answer.port)
    if getattr(request, "key_type", GROUP) == GROUP:
        call.proxy.cluster.coordinators[request.key] = answer.node_id
    host, port = call.proxy.advertised
    return replace(answer, node_id=call.proxy.node_id, host=host, port=port)
