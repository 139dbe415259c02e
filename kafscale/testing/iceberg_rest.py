"""An Iceberg REST catalog over HTTP on 127.0.0.1, for tests: the REST protocol's catalog and table endpoints,
stored in pyiceberg's SQL catalog (SQLite) behind it.

No REST catalog server can be installed here (the reference one is Java from Maven, others are containers or
Rust crates), so tests of `type: rest` catalogs talk to this one. The client side, pyiceberg's RestCatalog, is
the real one: requests and answers are the REST specification's JSON, built with pyiceberg's own models.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

__all__ = ["IcebergRestServer"]

_NAMESPACE_SEP = "\x1f"  # the REST spec's separator of multi-level namespace parts in a path


class IcebergRestServer:
    def __init__(self, root: Path) -> None:
        from pyiceberg.catalog.sql import SqlCatalog

        root.mkdir(parents=True, exist_ok=True)
        self.catalog = SqlCatalog("rest-backing", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/wh")
        self._lock = threading.Lock()  # one request at a time against the SQLite catalog
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, name="iceberg-rest", daemon=True)

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> IcebergRestServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def __enter__(self) -> IcebergRestServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- requests

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        from pyiceberg.exceptions import (
            CommitFailedException,
            NamespaceAlreadyExistsError,
            NoSuchNamespaceError,
            NoSuchTableError,
            TableAlreadyExistsError,
        )

        parts = [unquote(p) for p in path.split("?", 1)[0].strip("/").split("/")]
        if parts[:1] != ["v1"]:
            return _error(404, "NotFound", f"no route {path}")
        parts = parts[1:]
        try:
            with self._lock:
                return self._route(method, parts, json.loads(body) if body else None)
        except (NoSuchNamespaceError, NoSuchTableError) as e:
            return _error(404, type(e).__name__, str(e))
        except (NamespaceAlreadyExistsError, TableAlreadyExistsError, CommitFailedException) as e:
            return _error(409, type(e).__name__, str(e))

    def _route(self, method: str, parts: list[str], body: Any) -> tuple[int, Any]:
        from pyiceberg.catalog.rest import CreateTableRequest
        from pyiceberg.table import CommitTableRequest

        c = self.catalog
        if parts == ["config"] and method == "GET":
            return 200, {"defaults": {}, "overrides": {}}
        if parts == ["namespaces"]:
            if method == "GET":
                return 200, {"namespaces": [list(ns) for ns in c.list_namespaces()]}
            if method == "POST":
                c.create_namespace(tuple(body["namespace"]), body.get("properties") or {})
                return 200, {"namespace": body["namespace"], "properties": body.get("properties") or {}}
        if len(parts) == 2 and parts[0] == "namespaces":
            namespace = tuple(parts[1].split(_NAMESPACE_SEP))
            if method == "HEAD":
                return (204 if c.namespace_exists(namespace) else 404), None
            if method == "GET":
                return 200, {"namespace": list(namespace), "properties": c.load_namespace_properties(namespace)}
        if len(parts) >= 3 and parts[0] == "namespaces" and parts[2] == "tables":
            namespace = tuple(parts[1].split(_NAMESPACE_SEP))
            if len(parts) == 3 and method == "GET":
                return 200, {"identifiers": [{"namespace": list(t[:-1]), "name": t[-1]}
                                             for t in c.list_tables(namespace)]}
            if len(parts) == 3 and method == "POST":
                # The client leaves out what it has not set; the model wants these present, null or not.
                request = CreateTableRequest.model_validate(
                    {"location": None, "partition-spec": None, "write-order": None, **body})
                table = c.create_table((*namespace, request.name), schema=request.table_schema,
                                       location=request.location, partition_spec=request.partition_spec,
                                       sort_order=request.write_order, properties=request.properties)
                return 200, _table_response(table)
            if len(parts) == 4:
                identifier = (*namespace, parts[3])
                if method == "HEAD":
                    return (204 if c.table_exists(identifier) else 404), None
                if method == "GET":
                    return 200, _table_response(c.load_table(identifier))
                if method == "POST":
                    request = CommitTableRequest.model_validate(body)
                    response = c.commit_table(c.load_table(identifier), request.requirements, request.updates)
                    return 200, json.loads(response.model_dump_json(by_alias=True, exclude_none=True))
        return _error(404, "NotFound", f"{method} /v1/{'/'.join(parts)} is not served here")

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                try:
                    status, answer = server.handle(self.command, self.path, body)
                except Exception as e:  # answered as the spec's error object, so the client can say what failed
                    status, answer = _error(500, type(e).__name__, str(e))
                data = b"" if answer is None else json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if data and self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_HEAD = do_DELETE = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: test output shows failures, not every request

        return Handler


def _table_response(table: Any) -> dict[str, Any]:
    return {"metadata-location": table.metadata_location,
            "metadata": json.loads(table.metadata.model_dump_json(by_alias=True, exclude_none=True)), "config": {}}


def _error(code: int, kind: str, message: str) -> tuple[int, Any]:
    return code, {"error": {"message": message, "type": kind, "code": code}}
