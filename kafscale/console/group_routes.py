"""The Consumer groups pages: list, describe with lag, reset offsets, delete."""

from __future__ import annotations

from aiohttp import web

from kafscale.console import http_io as io
from kafscale.console.view import ClusterView, ConsoleError

RESETS = ("earliest", "latest", "offset", "timestamp")


def routes(view: ClusterView) -> list[web.RouteDef]:
    async def groups(_request: web.Request) -> web.Response:
        return io.answer(await view.groups())

    async def group(request: web.Request) -> web.Response:
        return io.answer(await view.group(request.match_info["group"]))

    async def reset_offsets(request: web.Request) -> web.Response:
        group_id = request.match_info["group"]
        body = await io.body(request, "topic", "to", "value")
        topic = io.topic_name(body.get("topic"))
        to = body.get("to")
        if to not in RESETS:
            raise ConsoleError(400, "to: expected earliest, latest, offset or timestamp")
        value = io.required_integer(body.get("value"), to) if to in ("offset", "timestamp") else None
        return io.answer({"group": group_id, "offsets": await view.reset_offsets(group_id, topic, to, value)})

    async def delete(request: web.Request) -> web.Response:
        group_id = request.match_info["group"]
        io.confirmed(request, group_id, "group")
        await view.delete_group(group_id)
        return io.answer({"deleted": group_id})

    return [web.get("/api/groups", groups), web.get("/api/groups/{group}", group),
            web.post("/api/groups/{group}/reset-offsets", reset_offsets), web.delete("/api/groups/{group}", delete)]
