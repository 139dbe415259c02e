"""FindCoordinator v5: v4 on the wire (FindCoordinatorRequest.json: v5 only adds TRANSACTION_ABORTABLE to the errors
a client must expect, KIP-890)."""

from dataclasses import dataclass
from typing import ClassVar

from kio.schema.find_coordinator.v4 import request as v4_request
from kio.schema.find_coordinator.v4 import response as v4_response
from kio.schema.find_coordinator.v4.response import Coordinator
from kio.static.primitive import i16

__all__ = ["Coordinator", "FindCoordinatorRequest", "FindCoordinatorResponse"]


@dataclass(frozen=True, slots=True, kw_only=True)
class FindCoordinatorRequest(v4_request.FindCoordinatorRequest):
    __version__: ClassVar[i16] = i16(5)


@dataclass(frozen=True, slots=True, kw_only=True)
class FindCoordinatorResponse(v4_response.FindCoordinatorResponse):
    __version__: ClassVar[i16] = i16(5)


REQUEST = FindCoordinatorRequest
RESPONSE = FindCoordinatorResponse
