"""The Placement page's actions: move a partition to a shard, drain a node (what leads what is the overview's)."""

from __future__ import annotations

from aiohttp import web

from kafscale.console import http_io as io
from kafscale.console.view import ClusterView


def routes(view: ClusterView) -> list[web.RouteDef]:
    async def move(request: web.Request) -> web.Response:
        body = await io.body(request, "topic", "partition", "shard")
        topic = io.topic_name(body.get("topic"))
        partition = io.required_integer(body.get("partition"), "partition", high=io.INT_MAX)
        shard = io.required_integer(body.get("shard"), "shard", high=io.INT_MAX)
        return io.answer(await view.move_partition(topic, partition, shard))

    async def drain(request: web.Request) -> web.Response:
        body = await io.body(request, "node")
        return io.answer({"moves": await view.drain_node(io.text(body.get("node"), "node"))})

    return [web.post("/api/placement/move", move), web.post("/api/placement/drain", drain)]
