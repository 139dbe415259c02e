"""ObjectStore on S3 (or any S3-compatible server) through boto3.

One boto3 client is created in the constructor and shared by every thread (kafscale.storage.s3_client says
how clients are built); segment PUTs go through the lean putter of kafscale.storage.s3_put where the server
takes it. What each S3 error means is kafscale.storage.s3_errors.

Retries live here rather than in botocore, for two reasons: a GET's body is streamed after botocore
has returned, so a connection dropped mid-body is only retried if the whole call is; and a
conditional create that is retried after an ambiguous failure (the first attempt may have been
applied) can meet its own object and get 412, which only this layer can recognise.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
)

from kafscale.storage.backoff import exponential
from kafscale.storage.object_store import ObjectInfo, ObjectNotFoundError, ObjectStore, ObjectStoreError, Volume
from kafscale.storage.s3_client import s3_client, session_credentials
from kafscale.storage.s3_errors import (
    LEAN_REFUSALS,
    NOT_FOUND_CODES,
    crc32c_header,
    describe,
    error_code,
    http_status,
    is_retryable,
)
from kafscale.storage.s3_put import Credentials, LeanPutter

T = TypeVar("T")

log = logging.getLogger(__name__)

_PROBE_PREFIX = "_kafscale-probe/crc32c-"  # the one PUT that tests whether the server checks CRC32C
_DELETE_BATCH = 1000  # DeleteObjects accepts at most 1,000 keys per request
_BACKOFF_BASE_S = 0.05
_BACKOFF_CAP_S = 2.0
_UNHANDLED: Any = object()  # returned by an on_error hook that leaves the error to _call


class S3Store(ObjectStore):
    def __init__(
        self,
        bucket: str,
        *,
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        access_key: str | None = None,
        secret_key: str | None = None,
        path_style: bool = True,
        create_bucket: bool = False,
        max_attempts: int = 5,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        max_pool_connections: int = 32,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.bucket = bucket
        self.endpoint_url = endpoint_url
        self.region = region
        self.max_attempts = max_attempts
        config = Config(
            region_name=region,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_pool_connections=max_pool_connections,
            # botocore retries nothing: _call() owns retries (see the module docstring).
            retries={"mode": "standard", "total_max_attempts": 1},
            # The body is not hashed into the signature (SHA-256 of every byte: half of botocore's CPU
            # for a 4 MiB PUT here). Each PUT carries its CRC32C in a header instead, which S3 (and
            # SeaweedFS) check against the bytes received, refusing a damaged body with BadDigest.
            # A server that ignores the header gets signed bodies (see _put_client).
            s3={"addressing_style": "path" if path_style else "virtual", "payload_signing_enabled": False},
            # No checksums of botocore's own but where S3 demands them (DeleteObjects): several
            # S3-compatible servers reject its default CRC trailers; the header above is ours.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        self._client = s3_client(
            endpoint_url=endpoint_url, region=region, access_key=access_key, secret_key=secret_key, config=config
        )
        self._signed_config = config.merge(Config(s3={**config.s3, "payload_signing_enabled": True}))
        self._credentials = (access_key, secret_key)
        self._checks_crc: bool | None = None  # does the server check x-amz-checksum-crc32c? (probed once)
        self._signed_client: Any = None
        self._probe_lock = threading.Lock()
        self._lean = self._lean_putter(access_key, secret_key, path_style, connect_timeout, read_timeout)
        if create_bucket:
            self._create_bucket()

    def __repr__(self) -> str:
        return f"S3Store(bucket={self.bucket!r}, endpoint_url={self.endpoint_url!r})"

    # -- plumbing ---------------------------------------------------------------------------------

    def _where(self, key: str | None) -> str:
        where = f"s3://{self.bucket}/{key}" if key is not None else f"s3://{self.bucket}"
        return f"{where} at {self.endpoint_url}" if self.endpoint_url else where

    def _backoff(self, attempt: int) -> None:
        # Full jitter: spreads out the retries of many threads that failed together.
        time.sleep(random.uniform(0, exponential(attempt, _BACKOFF_BASE_S, _BACKOFF_CAP_S)))

    def _call(
        self,
        op: str,
        key: str | None,
        fn: Callable[[], T],
        *,
        on_error: Callable[[ClientError, bool], Any] | None = None,
    ) -> T:
        """Run fn with retries; translate every failure into ObjectStoreError naming op and key.

        on_error may turn a ClientError into a result (anything but _UNHANDLED) before the retry
        logic sees it; its second argument tells whether an earlier attempt failed ambiguously,
        i.e. may have been applied by the server before the failure was reported.
        """
        ambiguous = False
        for attempt in range(self.max_attempts):
            try:
                return fn()
            except ClientError as exc:
                if on_error is not None:
                    result = on_error(exc, ambiguous)
                    if result is not _UNHANDLED:
                        return result
                if error_code(exc) == "NoSuchKey" and key is not None:
                    raise ObjectNotFoundError(key) from exc
                if not is_retryable(exc) or attempt == self.max_attempts - 1:
                    raise self._failure(op, key, exc, attempt + 1) from exc
                ambiguous = ambiguous or http_status(exc) >= 500
            except BotoCoreError as exc:
                if not is_retryable(exc) or attempt == self.max_attempts - 1:
                    raise self._failure(op, key, exc, attempt + 1) from exc
                ambiguous = True
            self._backoff(attempt)
        raise AssertionError("unreachable")

    def _failure(self, op: str, key: str | None, exc: Exception, attempts: int) -> ObjectStoreError:
        return ObjectStoreError(f"S3 {op} {self._where(key)} failed after {attempts} attempt(s): {describe(exc)}")

    def _create_bucket(self) -> None:
        kwargs: dict[str, Any] = {"Bucket": self.bucket}
        if self.region != "us-east-1":  # us-east-1 rejects an explicit LocationConstraint
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self.region}

        def already_there(exc: ClientError, _ambiguous: bool) -> Any:
            return None if error_code(exc) == "BucketAlreadyOwnedByYou" else _UNHANDLED

        self._call("create_bucket", None, lambda: self._client.create_bucket(**kwargs), on_error=already_there)

    # -- writes -----------------------------------------------------------------------------------

    def _put_client(self) -> Any:
        """The client for PUTs: unsigned bodies if the server checks their CRC32C header, else bodies
        signed with SHA-256, so that a body damaged on the way is refused either way (a body stored
        damaged would be found only on read, after the records were acknowledged)."""
        if self._checks_crc is None:
            with self._probe_lock:
                if self._checks_crc is None:
                    self._checks_crc = self._probe_crc_check()
        if self._checks_crc:
            return self._client
        if self._signed_client is None:
            self._signed_client = s3_client(endpoint_url=self.endpoint_url, region=self.region,
                                            access_key=self._credentials[0], secret_key=self._credentials[1],
                                            config=self._signed_config)
        return self._signed_client

    def volume(self, prefix: str) -> Volume:
        return Volume(f"s3://{self.bucket}/{prefix}")

    def warm_up(self) -> None:
        # The CRC probe is botocore's first PutObject in the process, which costs ~200 ms of lazy set-up:
        # a shard does it when it starts instead of inside the first produce's flush.
        with contextlib.suppress(Exception):
            self._put_client()

    def _probe_crc_check(self) -> bool | None:
        """PUT a probe whose CRC32C header is wrong: refused means the server checks it. None when the
        probe itself failed (asked again on the next PUT, which is signed meanwhile)."""
        key = f"{_PROBE_PREFIX}{uuid.uuid4().hex}"
        wrong = crc32c_header(b"not the body")
        try:
            self._client.put_object(Bucket=self.bucket, Key=key, Body=b"kafscale checksum probe",
                                    ChecksumCRC32C=wrong)
        except ClientError as exc:
            code = error_code(exc)
            if "Digest" in code or "Checksum" in code:
                return True
            return None
        except BotoCoreError:
            return None
        log.warning("%s ignores x-amz-checksum-crc32c: PUT bodies are signed with SHA-256 instead",
                    self._where(None))
        with contextlib.suppress(ClientError, BotoCoreError):
            self._client.delete_object(Bucket=self.bucket, Key=key)
        return False

    def _lean_putter(self, access_key: str | None, secret_key: str | None, path_style: bool,
                     connect_timeout: float, read_timeout: float) -> LeanPutter | None:
        """The botocore-free PUT path, for an S3-compatible endpoint with path-style URLs (AWS itself,
        without an endpoint URL, stays on botocore)."""
        if not self.endpoint_url or not path_style:
            return None
        if access_key and secret_key:
            fixed = Credentials(access_key, secret_key)

            def credentials() -> Credentials:
                return fixed
        else:
            chain = session_credentials()
            if chain is None:
                return None

            def credentials() -> Credentials:
                frozen = chain.get_frozen_credentials()  # refreshed by botocore when they expire
                return Credentials(frozen.access_key, frozen.secret_key, frozen.token)
        return LeanPutter(self.endpoint_url, self.bucket, self.region, credentials,
                          connect_timeout=connect_timeout, read_timeout=read_timeout)

    def _put_object(self, key: str, data: bytes, checksum: str, *, if_none_match: bool) -> None:
        client = self._put_client()
        lean = self._lean
        if client is self._client and lean is not None:  # the server checks the CRC32C header
            try:
                lean.put(key, data, checksum, if_none_match=if_none_match)
                return
            except ClientError as exc:
                if error_code(exc) not in LEAN_REFUSALS:
                    raise
                self._lean = None
                log.warning("%s refused a lean PUT (%s): PUTs go through botocore from now on",
                            self._where(key), describe(exc))
        extra = {"IfNoneMatch": "*"} if if_none_match else {}
        client.put_object(Bucket=self.bucket, Key=key, Body=data, ChecksumCRC32C=checksum, **extra)

    def put(self, key: str, data: bytes) -> None:
        checksum = crc32c_header(data)
        self._call("put", key, lambda: self._put_object(key, data, checksum, if_none_match=False))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        checksum = crc32c_header(data)

        def attempt() -> bool:
            self._put_object(key, data, checksum, if_none_match=True)
            return True

        def on_error(exc: ClientError, ambiguous: bool) -> Any:
            if error_code(exc) != "PreconditionFailed" and http_status(exc) != 412:
                return _UNHANDLED
            # After an ambiguous failure the object we now collide with may be our own earlier
            # attempt; identical bytes mean the create took effect, which is all callers rely on.
            return ambiguous and self._same_bytes(key, data)

        return self._call("put_if_absent", key, attempt, on_error=on_error)

    def _same_bytes(self, key: str, data: bytes) -> bool:
        try:
            return self.get(key) == data
        except ObjectNotFoundError:
            return False

    # -- reads ------------------------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        def attempt() -> bytes:
            resp = self._client.get_object(Bucket=self.bucket, Key=key)
            with resp["Body"] as body:
                return body.read()

        return self._call("get", key, attempt)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise ValueError(f"invalid range for {key!r}: start={start} length={length}")
        if length == 0:
            # HTTP cannot express an empty range; keep the missing-key contract with a HEAD.
            if self.head(key) is None:
                raise ObjectNotFoundError(key)
            return b""

        def attempt() -> bytes:
            resp = self._client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={start}-{start + length - 1}")
            with resp["Body"] as body:
                data = body.read()
            if resp["ResponseMetadata"]["HTTPStatusCode"] == 200:
                # The server ignored Range and sent the whole object.
                return data[start : start + length]
            return data

        def on_error(exc: ClientError, _ambiguous: bool) -> Any:
            # 416: start is at or past the end (including any range of an empty object).
            if error_code(exc) == "InvalidRange" or http_status(exc) == 416:
                return b""
            return _UNHANDLED

        return self._call("get_range", key, attempt, on_error=on_error)

    def head(self, key: str) -> ObjectInfo | None:
        def attempt() -> ObjectInfo | None:
            resp = self._client.head_object(Bucket=self.bucket, Key=key)
            return ObjectInfo(key, int(resp["ContentLength"]), _seconds(resp.get("LastModified")))

        def on_error(exc: ClientError, _ambiguous: bool) -> Any:
            # HEAD responses have no body, so a missing key is only a bare 404.
            return None if error_code(exc) in NOT_FOUND_CODES or http_status(exc) == 404 else _UNHANDLED

        return self._call("head", key, attempt, on_error=on_error)

    def list(self, prefix: str, start_after: str = "", page_size: int = 1000) -> Iterator[ObjectInfo]:
        if page_size < 1:
            raise ValueError(f"page_size must be positive, got {page_size}")
        request: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "MaxKeys": min(page_size, 1000)}
        if start_after:
            request["StartAfter"] = start_after
        what = f"{prefix}*"
        while True:
            page = self._call("list", what, lambda req=dict(request): self._client.list_objects_v2(**req))
            contents = page.get("Contents", [])
            for item in contents:
                yield ObjectInfo(item["Key"], int(item["Size"]), _seconds(item.get("LastModified")))
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")
            if token:
                request["ContinuationToken"] = token
            elif contents:
                # Some S3-compatible servers omit the token; resume after the last key instead.
                request.pop("ContinuationToken", None)
                request["StartAfter"] = contents[-1]["Key"]
            else:
                raise ObjectStoreError(f"S3 list {self._where(what)}: truncated page without a way to continue")

    # -- deletes ----------------------------------------------------------------------------------

    def delete(self, key: str) -> None:
        def on_error(exc: ClientError, _ambiguous: bool) -> Any:
            # S3 answers 204 for a missing key; some compatible servers say NoSuchKey instead.
            return None if error_code(exc) in NOT_FOUND_CODES else _UNHANDLED

        self._call("delete", key, lambda: self._client.delete_object(Bucket=self.bucket, Key=key), on_error=on_error)

    def delete_many(self, keys: list[str]) -> None:
        for i in range(0, len(keys), _DELETE_BATCH):
            chunk = keys[i : i + _DELETE_BATCH]
            request = {"Objects": [{"Key": k} for k in chunk], "Quiet": True}
            resp = self._call(
                "delete_many",
                f"{chunk[0]} … ({len(chunk)} keys)",
                lambda req=request: self._client.delete_objects(Bucket=self.bucket, Delete=req),
            )
            errors = [e for e in resp.get("Errors", []) if e.get("Code") not in NOT_FOUND_CODES]
            if errors:
                sample = ", ".join(f"{e.get('Key')}: {e.get('Code')} {e.get('Message', '')}" for e in errors[:5])
                raise ObjectStoreError(f"S3 delete_many in {self._where(None)}: {len(errors)} key(s) failed: {sample}")

    def close(self) -> None:
        self._client.close()
        if self._signed_client is not None:
            self._signed_client.close()


def _seconds(when: Any) -> float:
    """S3's LastModified (a datetime from botocore) as seconds since the epoch; 0.0 when absent."""
    return when.timestamp() if when is not None else 0.0
