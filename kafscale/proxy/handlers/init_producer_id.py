"""InitProducerId: an idempotent producer's id comes from the upstream, passed through; it names the producer in
the proxy's table of upstream ids (kafscale.proxy.producers). Transactions are refused: their markers and their
offset commits would need the same translation, which the proxy does not do."""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

from kafscale.protocol.codec import make, response_class
from kafscale.proxy.state import Call

API_KEY, MIN_VERSION, MAX_VERSION = 22, 0, 4
log = logging.getLogger(__name__)


async def handle(call: Call, request: Any) -> Any:
    if request.transactional_id is not None:
        log.warning("refused transactional producer %r: the proxy does not translate transactions",
                    request.transactional_id)
        call.proxy.metrics.refused.labels("InitProducerId").inc()
        return make(response_class(API_KEY, request.__version__), throttle_time=0,
                    error_code=ErrorCode.transactional_id_authorization_failed, producer_id=-1, producer_epoch=-1)
    return await call.session.send(request)
