"""S3Store's botocore-free PUT path (kafscale/storage/s3_put.py) against real S3 servers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kafscale.storage.s3_put import Credentials, LeanPutter
from kafscale.storage.s3_store import S3Store
from kafscale.testing.s3_servers import MotoS3Server, SeaweedS3Server


def _count_botocore_puts(store: S3Store) -> list[Any]:
    calls: list[Any] = []
    for client in (store._client, store._signed_client):
        if client is not None:
            client.meta.events.register("before-call.s3.PutObject", lambda **kw: calls.append(kw))
    return calls


@pytest.fixture
def seaweed_store(seaweed_server: SeaweedS3Server) -> Iterator[S3Store]:
    store = seaweed_server.store()
    yield store
    store.delete_many([o.key for o in store.list("")])


def test_segment_puts_on_a_crc_checking_server_bypass_botocore(seaweed_store: S3Store) -> None:
    """SeaweedFS checks x-amz-checksum-crc32c, so puts and conditional creates take the lean path:
    botocore sends no PutObject, and what is stored is exactly what was put."""
    seaweed_store.put("probe-first", b"x")  # the CRC32C probe runs before the first PUT
    calls = _count_botocore_puts(seaweed_store)
    body = bytes(range(256)) * 1000
    seaweed_store.put("a/b c+d.kfs", body)
    assert seaweed_store.put_if_absent("a/new.kfs", body) is True
    assert seaweed_store.put_if_absent("a/new.kfs", b"other bytes") is False
    assert calls == [], "a PUT went through botocore"
    assert seaweed_store.get("a/b c+d.kfs") == body
    assert seaweed_store.get("a/new.kfs") == body


class _RefusingPutter(LeanPutter):
    """A server whose signing rules LeanPutter misses answers SignatureDoesNotMatch. Neither test server
    checks signatures, so this one fault is made here."""

    def put(self, key: str, body: bytes, crc32c_b64: str, *, if_none_match: bool = False) -> None:
        from botocore.exceptions import ClientError

        raise ClientError({"Error": {"Code": "SignatureDoesNotMatch", "Message": "no"},
                           "ResponseMetadata": {"HTTPStatusCode": 403}}, "PutObject")


def test_a_server_that_refuses_the_lean_request_gets_botocore_from_then_on(seaweed_server: SeaweedS3Server,
                                                                           seaweed_store: S3Store) -> None:
    """A lean PUT refused for its signing is sent again through botocore and stored; later PUTs go
    through botocore."""
    seaweed_store.put("probe-first", b"x")
    seaweed_store._lean = _RefusingPutter(seaweed_server.endpoint_url, seaweed_store.bucket, seaweed_server.region,
                                          lambda: Credentials("a", "b"), connect_timeout=5, read_timeout=30)
    calls = _count_botocore_puts(seaweed_store)
    assert seaweed_store.put_if_absent("k", b"stored anyway") is True
    assert seaweed_store.get("k") == b"stored anyway"
    assert seaweed_store._lean is None
    seaweed_store.put("k2", b"again")
    assert len(calls) == 2


def test_a_server_that_ignores_the_crc32c_header_never_gets_lean_puts(moto_server: MotoS3Server) -> None:
    """moto accepts a wrong CRC32C header, so its PUTs stay on botocore with SHA-256-signed bodies."""
    store = moto_server.store()
    store.put("first", b"x")
    calls = _count_botocore_puts(store)
    store.put("second", b"y")
    assert len(calls) == 1
    assert store.get("second") == b"y"


def test_the_lean_putter_reports_s3_errors_as_botocore_client_errors(seaweed_server: SeaweedS3Server) -> None:
    """A PUT into a bucket that does not exist: the server's error code reaches the caller."""
    from botocore.exceptions import ClientError

    putter = LeanPutter(seaweed_server.endpoint_url, "no-such-bucket-kafscale", seaweed_server.region,
                        lambda: Credentials(seaweed_server.access_key, seaweed_server.secret_key),
                        connect_timeout=5, read_timeout=30)
    with pytest.raises(ClientError) as info:
        putter.put("k", b"v", "AAAAAA==")
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] >= 400
    assert info.value.response["Error"]["Code"] not in ("", "200")


def test_the_lean_signature_is_the_one_botocore_computes() -> None:
    """Neither test server checks signatures, so the request's Authorization header is compared with
    botocore's own SigV4 signer for the same request, credentials (with a session token) and time."""
    import datetime

    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.config import Config
    from botocore.credentials import Credentials as BotoCredentials

    putter = LeanPutter("http://127.0.0.1:9000", "bkt", "eu-west-1", lambda: Credentials("AKID", "SECRET", "TOKEN"),
                        connect_timeout=1, read_timeout=1)
    path = "/bkt/ns/topic-1/0/00000000000000000042%20x%2B.kfs"
    base = {"host": "127.0.0.1:9000", "x-amz-checksum-crc32c": "yZRlqg==", "x-amz-content-sha256": "UNSIGNED-PAYLOAD",
            "if-none-match": "*"}
    request = AWSRequest(method="PUT", url="http://127.0.0.1:9000" + path, headers=dict(base), data=b"body")
    request.context["client_config"] = Config(s3={"payload_signing_enabled": False})  # as S3Store's client
    S3SigV4Auth(BotoCredentials("AKID", "SECRET", "TOKEN"), "s3", "eu-west-1").add_auth(request)
    when = datetime.datetime.strptime(request.headers["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.UTC)
    ours = dict(base)
    putter._sign(path, ours, when)
    assert ours["x-amz-security-token"] == "TOKEN"
    assert ours["authorization"] == request.headers["Authorization"]
