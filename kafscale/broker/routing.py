"""Where a partition's request goes (ShardCore.route): its owner here, the shard that leads it, or an error."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

if TYPE_CHECKING:
    from kafscale.broker.interface import Peer
    from kafscale.broker.partition_owner import PartitionOwner


@dataclass(frozen=True, slots=True)
class Local:
    owner: PartitionOwner


@dataclass(frozen=True, slots=True)
class Remote:
    peer: Peer
    shard: int


@dataclass(frozen=True, slots=True)
class Refused:
    error: ErrorCode


Route = Local | Remote | Refused
