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
        body = await io.body(request)
        name = io.topic_name(str(body.get("name", "")))
        partitions = io.integer(body.get("partitions"), "partitions", low=1, high=MAX_PARTITIONS) or 1
        configs = body.get("configs") or {}
        if not isinstance(configs, dict) or not all(isinstance(v, str | int) for v in configs.values()):
            raise ConsoleError(400, "configs: expected an object of config names to values")
        await view.create_topic(name, partitions, {str(k): str(v) for k, v in configs.items()})
        return io.answer({"created": name}, 201)

    async def alter_configs(request: web.Request) -> web.Response:
        name = io.topic_name(request.match_info["name"])
        body = await io.body(request)
        set_configs, delete = body.get("set") or {}, body.get("delete") or []
        if not isinstance(set_configs, dict) or not isinstance(delete, list):
            raise ConsoleError(400, 'expected {"set": {name: value}, "delete": [name]}')
        await view.alter_topic_configs(name, {str(k): str(v) for k, v in set_configs.items()}, [str(d) for d in delete])
        return io.answer(await view.topic(name))

    async def delete(request: web.Request) -> web.Response:
        name = io.topic_name(request.match_info["name"])
        io.confirmed(request, name, "topic")
        await view.delete_topic(name)
        return io.answer({"deleted": name})

    async def messages(request: web.Request) -> web.Response:
        name = io.topic_name(request.match_info["name"])
        partition = io.required_integer(request.match_info["partition"], "partition")
        offset = io.integer(request.query.get("offset"), "offset")
        timestamp = io.integer(request.query.get("timestamp"), "timestamp")
        limit = io.integer(request.query.get("limit"), "limit", low=1, high=MAX_PAGE) or 50
        if offset is not None and timestamp is not None:
            raise ConsoleError(400, "give offset or timestamp, not both")
        return io.answer(await view.messages(name, partition, offset=offset, timestamp=timestamp, limit=limit))

    async def produce(request: web.Request) -> web.Response:
        name = io.topic_name(request.match_info["name"])
        body = await io.body(request)
        encoding = body.get("encoding", "text")
        if encoding not in ("text", "base64"):
            raise ConsoleError(400, "encoding: expected text or base64")
        headers = body.get("headers") or {}
        if not isinstance(headers, dict):
            raise ConsoleError(400, "headers: expected an object of header names to values")
        produced = await view.produce(
            name, io.integer(body.get("partition"), "partition"), io.payload(body.get("key"), "key", encoding),
            io.payload(body.get("value"), "value", encoding),
            [(str(k), io.payload(v, f"header {k}", encoding) or b"") for k, v in headers.items()])
        return io.answer(produced, 201)

    return [
        web.get("/api/topics", topics), web.post("/api/topics", create), web.get("/api/topics/{name}", topic),
        web.patch("/api/topics/{name}/configs", alter_configs), web.delete("/api/topics/{name}", delete),
        web.get("/api/topics/{name}/partitions/{partition}/messages", messages),
        web.post("/api/topics/{name}/messages", produce),
    ]
