"""ApiVersions (key 18), v0–v4: advertises exactly what the Router has registered.

Kafka's behaviour, followed here:
* A version newer than we support is not parsed; the answer is a **v0** response (v0 header)
  with UNSUPPORTED_VERSION and an api list holding only ApiVersions' own range, so the client
  retries with the highest version we have (KIP-511; ApiVersionsRequest.getErrorResponse).
* v3+ requests carry client_software_name/version; names that do not match Kafka's pattern get
  INVALID_REQUEST with an empty api list.
* v3+ responses have tagged fields (supported/finalized features, features epoch, zk migration).
  The features here are `transaction.version` (supported 0-2, finalized at the broker's
  `transaction_version`): a Kafka 4 client uses transactions v2 (KIP-890 part 2) once it is finalized at
  2 with an epoch >= 0; and `group.version` (supported 0-1, finalized at 1, as Kafka 4 does): the consumer
  group protocol of KIP-848 is served. As Kafka does, v0-v3 answers omit supported features whose minimum is 0, and a
  feature finalized at 0 is not listed. Tags left at their defaults are not written (librdkafka 2.0,
  kcat, fails on default-valued tags, and Kafka omits them too).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from kafscale.acceptor.blocked_producers import librdkafka
from kafscale.protocol.codec import make, nested, request_class, response_class
from kafscale.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from kafscale.acceptor.router import Handler, RequestContext, Router

__all__ = ["API_KEY", "GROUP_VERSION", "MAX_VERSION", "MIN_VERSION", "SUPPORTED_FEATURES", "TRANSACTION_VERSION",
           "UNSUPPORTED_VERSION_REQUEST", "api_versions_handler"]

API_KEY = 18
MIN_VERSION = 0
MAX_VERSION = 4
FEATURES_SINCE = 3
ALL_SUPPORTED_FEATURES_SINCE = 4  # v0-v3 leave out supported features whose minimum level is 0

TRANSACTION_VERSION = "transaction.version"
GROUP_VERSION = "group.version"  # 1: the consumer group protocol (KIP-848) is served; Kafka 4 finalizes it at 1
SUPPORTED_FEATURES: dict[str, tuple[int, int]] = {TRANSACTION_VERSION: (0, 2), GROUP_VERSION: (0, 1)}
# The finalized levels never change while a broker runs (they are configuration, not a cluster-wide vote as in
# KRaft): one epoch, >= 0 so that clients take them.
FEATURES_EPOCH = 0

# What the listener dispatches for an ApiVersions request whose version we do not support:
# Kafka does not parse such a body either, it treats the request as an empty v0 request.
UNSUPPORTED_VERSION_REQUEST: Any = request_class(API_KEY, 0)()

# Kafka's ApiVersionsRequest.SOFTWARE_NAME_VERSION_PATTERN
_SOFTWARE = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")


def api_versions_handler(router: Router) -> Handler:
    """The handler the Router installs for itself (it answers from router.supported())."""

    async def handle(ctx: RequestContext, request: Any) -> Any:
        version = ctx.api_version
        if not MIN_VERSION <= version <= MAX_VERSION:
            return _response(0, ErrorCode.unsupported_version, {API_KEY: (MIN_VERSION, MAX_VERSION)})
        if version >= 3 and not (
            _SOFTWARE.fullmatch(request.client_software_name)
            and _SOFTWARE.fullmatch(request.client_software_version)
        ):
            return _response(version, ErrorCode.invalid_request, {})
        if version >= 3 and ctx.produce_waits is not None:
            ctx.produce_waits.counts_records = librdkafka(request.client_software_name,
                                                          request.client_software_version)
        return _response(version, ErrorCode.none, router.supported(), router.finalized_features)

    return handle


def _response(version: int, error: ErrorCode, apis: dict[int, tuple[int, int]],
              finalized: dict[str, int] | None = None) -> Any:
    cls = response_class(API_KEY, version)
    entry = nested(cls, "ApiVersion")
    features: dict[str, Any] = {}
    if version >= FEATURES_SINCE and error == ErrorCode.none:
        supported, levels = nested(cls, "SupportedFeatureKey"), nested(cls, "FinalizedFeatureKey")
        features = {
            "supported_features": tuple(
                supported(name=name, min_version=lo, max_version=hi) for name, (lo, hi) in SUPPORTED_FEATURES.items()
                if lo > 0 or version >= ALL_SUPPORTED_FEATURES_SINCE),
            "finalized_features_epoch": FEATURES_EPOCH,
            "finalized_features": tuple(
                levels(name=name, min_version_level=level, max_version_level=level)
                for name, level in (finalized or {}).items() if level > 0),
        }
    return make(
        cls,
        error_code=error,
        api_keys=tuple(
            entry(api_key=key, min_version=lo, max_version=hi) for key, (lo, hi) in sorted(apis.items())
        ),
        throttle_time=0,
        **features,
    )
