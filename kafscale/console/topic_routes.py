"""The Topics pages: list, create, describe, alter configs, delete, browse messages, produce a test message."""

from __future__ import annotations

from aiohttp import web

from kafscale.console import http_io as io
from kafscale.console.view import ClusterView, ConsoleError

MAX_PAGE = 500
MAX_PARTITIONS = 100_000


def routes(view: ClusterView) -> list[web.RouteDef]:
    async def topics(_request: web.Request) -> web.Response:
        return io.answer(await view.topics())

    async def topic(request: web.Request) -> web.Response:
        return io.answer(await view.topic(io.topic_name(request.match_info["name"])))

    async def create(request: web.Request) -> web.Response:
        body = await io.body(request, "name", "partitions", "configs")
        name = io.topic_name(body.get("name"))
        partitions = io.integer(body.get("partitions"), "partitions", low=1, high=MAX_PARTITIONS) or 1
        await view.create_topic(name, partitions, io.settings(body.get("configs") or {}, "configs"))
        return io.answer({"created": name}, 201)

    async def alter_configs(request: web.Request) -> web.Response:
        name = io.topic_name(request.match_info["name"])
        body = await io.body(request, "set", "delete")
        delete = body.get("delete") or []
        if not isinstance(delete, list) or not all(isinstance(d, str) for d in delete):
            raise ConsoleError(400, 'delete: expected a list of config names ({"set": {...}, "delete": [...]})')
        await view.alter_topic_configs(name, io.settings(body.get("set") or {}, "set"), delete)
        return io.answer(await view.topic(name))

    async def delete(request: web.Request) -> web.Response:
        name = io.topic_name(request.match_info["name"])
        io.confirmed(request, name, "topic")
        await view.delete_topic(name)
        return io.answer({"deleted": name})

    async def messages(request: web.Request) -> web.Response:
        name = io.topic_name(request.match_info["name"])
        partition = io.required_integer(request.match_info["partition"], "partition", high=io.INT_MAX)
        offset = io.integer(request.query.get("offset"), "offset")
        timestamp = io.integer(request.query.get("timestamp"), "timestamp")
        limit = io.integer(request.query.get("limit"), "limit", low=1, high=MAX_PAGE) or 50
        if offset is not None and timestamp is not None:
            raise ConsoleError(400, "give offset or timestamp, not both")
        return io.answer(await view.messages(name, partition, offset=offset, timestamp=timestamp, limit=limit))

    async def produce(request: web.Request) -> web.Response:
        name = io.topic_name(request.match_info["name"])
        body = await io.body(request, "key", "value", "headers", "partition", "encoding")
        encoding = body.get("encoding", "text")
        if encoding not in ("text", "base64"):
            raise ConsoleError(400, "encoding: expected text or base64")
        headers = io.settings(body.get("headers") or {}, "headers")
        produced = await view.produce(
            name, io.integer(body.get("partition"), "partition", high=io.INT_MAX),
            io.payload(body.get("key"), "key", encoding),
            io.payload(body.get("value"), "value", encoding),
            [(str(k), io.payload(v, f"header {k}", encoding) or b"") for k, v in headers.items()])
        return io.answer(produced, 201)

    return [
        web.get("/api/topics", topics), web.post("/api/topics", create), web.get("/api/topics/{name}", topic),
        web.patch("/api/topics/{name}/configs", alter_configs), web.delete("/api/topics/{name}", delete),
        web.get("/api/topics/{name}/partitions/{partition}/messages", messages),
        web.post("/api/topics/{name}/messages", produce),
    ]
