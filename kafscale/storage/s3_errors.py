"""What S3's errors mean to Kafscale: which may succeed when retried, which say "not found", which refuse
the lean PUT path, and how to name them in a log line or an error message."""

from __future__ import annotations

import base64

from botocore.exceptions import (
    ClientError,
    ConnectionError,
    FlexibleChecksumError,
    HTTPClientError,
    IncompleteReadError,
)
from crc32c import crc32c

# Errors after which the same request may succeed; botocore's own "standard" mode list plus S3's.
RETRYABLE_CODES = frozenset(
    {
        "InternalError",
        "ServiceUnavailable",
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "TooManyRequests",
        "RequestTimeout",
        "RequestTimeoutException",
        "OperationAborted",
        # 409 on a conditional write racing another write of the same key; AWS says retry.
        "ConditionalRequestConflict",
        # The body arrived damaged (its CRC32C header did not match): nothing was stored.
        "BadDigest",
    }
)
TRANSPORT_ERRORS = (ConnectionError, HTTPClientError, IncompleteReadError, FlexibleChecksumError)
NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
# A lean PUT refused with one of these is a request the server does not take from LeanPutter (its
# signing, or a header it does not support): PUTs then go through botocore for good.
LEAN_REFUSALS = frozenset({"SignatureDoesNotMatch", "AuthorizationHeaderMalformed", "InvalidRequest",
                            "InvalidArgument", "NotImplemented", "AccessDenied", "MissingContentLength",
                            "XAmzContentSHA256Mismatch", "400", "403", "501"})


def crc32c_header(data: bytes) -> str:
    """The x-amz-checksum-crc32c value of data: its CRC32C, big-endian, base64."""
    return base64.b64encode(crc32c(data).to_bytes(4, "big")).decode("ascii")


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def http_status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def is_retryable(exc: Exception) -> bool:
    if isinstance(exc, TRANSPORT_ERRORS):
        return True
    if isinstance(exc, ClientError):
        return error_code(exc) in RETRYABLE_CODES or http_status(exc) >= 500 or http_status(exc) == 429
    return False


def describe(exc: Exception) -> str:
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        return f"{err.get('Code', '?')} (HTTP {http_status(exc)}): {err.get('Message', '')}".rstrip(": ")
    return f"{type(exc).__name__}: {exc}"
