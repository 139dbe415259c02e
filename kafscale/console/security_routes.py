"""The Security page: SCRAM users (their passwords set, never shown) and ACLs, listed, created and removed."""

from __future__ import annotations

from aiohttp import web

from kafscale.console import http_io as io
from kafscale.console.view import AclEntry, ClusterView, ConsoleError

MIN_ITERATIONS, MAX_ITERATIONS = 4096, 16384  # Kafka's bounds for SCRAM iterations


ACL_FIELDS = ("resource_type", "resource_name", "pattern_type", "principal", "host", "operation", "permission")


def _entry(body: dict[str, object]) -> AclEntry:
    def field(name: str, default: str = "") -> str:
        value = body.get(name, default)
        if not isinstance(value, str):
            raise ConsoleError(400, f"{name}: expected a string, got {value!r}")
        return value

    return AclEntry(field("resource_type"), field("resource_name"), field("pattern_type", "LITERAL"),
                    field("principal"), field("host", "*"), field("operation"), field("permission", "ALLOW"))


def routes(view: ClusterView) -> list[web.RouteDef]:
    async def users(_request: web.Request) -> web.Response:
        return io.answer(await view.users())

    async def upsert_user(request: web.Request) -> web.Response:
        body = await io.body(request, "name", "mechanism", "password", "iterations")
        name = io.text(body.get("name"), "name")
        iterations = io.integer(body.get("iterations"), "iterations", low=MIN_ITERATIONS,
                                high=MAX_ITERATIONS) or MIN_ITERATIONS
        await view.upsert_user(name, io.text(body.get("mechanism", "SCRAM-SHA-256"), "mechanism"),
                               io.text(body.get("password"), "password"), iterations)
        return io.answer({"user": name}, 201)

    async def delete_user(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        io.confirmed(request, name, "user")
        await view.delete_user(name, request.query.get("mechanism", "SCRAM-SHA-256"))
        return io.answer({"deleted": name})

    async def acls(_request: web.Request) -> web.Response:
        return io.answer(await view.acls())

    async def create_acl(request: web.Request) -> web.Response:
        entry = _entry(await io.body(request, *ACL_FIELDS))
        await view.create_acl(entry)
        return io.answer(entry, 201)

    async def delete_acl(request: web.Request) -> web.Response:
        entry = _entry(await io.body(request, *ACL_FIELDS))
        io.confirmed(request, entry.principal, "the ACL of")  # the principal named again
        return io.answer({"deleted": await view.delete_acl(entry)})

    return [web.get("/api/users", users), web.post("/api/users", upsert_user),
            web.delete("/api/users/{name}", delete_user), web.get("/api/acls", acls),
            web.post("/api/acls", create_acl), web.post("/api/acls/delete", delete_acl)]
