"""boto3 S3 clients, built from one process-wide session.

botocore clients are thread-safe once built, while building them is not, so they are built under a lock.
The session caches its parsed service model and resolved default credentials: about 0.05 s per client
instead of 0.3 s with a new session each time (Spark tasks build many).
"""

from __future__ import annotations

import threading
from typing import Any

import boto3
from botocore.config import Config
from botocore.credentials import Credentials as BotoCredentials

_session_lock = threading.Lock()
_session: boto3.session.Session | None = None


def s3_client(
    *,
    endpoint_url: str | None,
    region: str,
    access_key: str | None,
    secret_key: str | None,
    config: Config | None = None,
) -> Any:
    """A new boto3 S3 client; credentials left unset come from boto3's default chain."""
    global _session
    with _session_lock:
        if _session is None:
            # Not boto3's default session: other code may reconfigure that one at any time.
            _session = boto3.session.Session()
        return _session.client(
            "s3",
            endpoint_url=endpoint_url or None,
            region_name=region,
            aws_access_key_id=access_key or None,
            aws_secret_access_key=secret_key or None,
            config=config,
        )


def session_credentials() -> BotoCredentials | None:
    """The default credential chain's credentials, as the session resolved them (None: there are none)."""
    assert _session is not None  # made by s3_client()
    return _session.get_credentials()
