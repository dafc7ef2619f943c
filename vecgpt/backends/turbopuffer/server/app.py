"""The HTTP side (starlette, imported when the app is built): routes, gzip and JSON bodies, bearer auth,
the simulated network and commit latencies, error replies, and GET|DELETE /_local/stats. Injected faults
wrap the app (`faults`)."""

from __future__ import annotations

import asyncio
import gzip

from vecgpt.backends.turbopuffer.server.bodies import dumps, loads
from vecgpt.backends.turbopuffer.server.faults import with_faults
from vecgpt.backends.turbopuffer.server.limits import MAX_BODY, ApiError
from vecgpt.backends.turbopuffer.server.query import slots_needed


def reply(obj, status=200, headers=None):
    from starlette.responses import Response

    return Response(dumps(obj), status_code=status, media_type="application/json", headers=headers)


async def body_of(request) -> dict:
    """The request's JSON object, gunzipped if sent with `content-encoding: gzip`."""
    raw = await request.body()
    if request.headers.get("content-encoding", "").lower() == "gzip":
        try:
            raw = gzip.decompress(raw)
        except OSError:
            raise ApiError(400, "the body is not valid gzip") from None
    if len(raw) > MAX_BODY:
        raise ApiError(413, f"request body of {len(raw)} bytes exceeds {MAX_BODY}")
    try:
        body = loads(raw) if raw else {}
    except ValueError:
        raise ApiError(400, "the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


class Handlers:
    """The endpoints of one server; `wrap` adds the stats, the latency, auth and error replies."""

    def __init__(self, server):
        self.server = server

    def wrap(self, kind, fn):
        server = self.server

        async def handle(request):
            server.stats["requests"] += 1
            server.stats[kind] += 1
            try:
                if server.latency:
                    await asyncio.sleep(server.latency)
                self.authorize(request.headers.get("authorization", ""))
                return reply(await fn(request))
            except ApiError as e:
                server.stats[f"status_{e.status}"] += 1
                return reply({"status": "error", "error": e.message}, e.status, e.headers)

        return handle

    def authorize(self, auth: str) -> None:
        if not auth.startswith("Bearer ") or not auth[7:].strip():
            raise ApiError(401, "missing API key: send Authorization: Bearer <key>")
        if self.server.api_key is not None and auth[7:].strip() != self.server.api_key:
            raise ApiError(401, "invalid API key")

    async def write(self, request):
        from starlette.concurrency import run_in_threadpool

        name = request.path_params["ns"]
        body = await body_of(request)
        await self.commit()
        return await run_in_threadpool(self.server.write, name, body)

    async def commit(self) -> None:
        """A write returns once committed (the service: up to ~200 ms); it becomes visible as it returns."""
        if self.server.write_latency:
            await asyncio.sleep(self.server.write_latency)

    async def query(self, request):
        from starlette.concurrency import run_in_threadpool

        server, name = self.server, request.path_params["ns"]
        body = await body_of(request)
        server.get(name)
        need, subqueries = slots_needed(body)
        server.stats["subqueries"] += subqueries
        await server.acquire(name, need)
        try:
            return await run_in_threadpool(server.query, name, body)
        finally:
            await server.release(name, need)

    async def delete(self, request):
        self.server.get(request.path_params["ns"])
        await self.commit()
        return self.server.delete(request.path_params["ns"])

    async def metadata(self, request):
        return self.server.metadata(request.path_params["ns"])

    async def schema(self, request):
        return self.server.schema(request.path_params["ns"])

    async def warm(self, request):
        self.server.get(request.path_params["ns"])
        return {"status": "ACCEPTED"}

    async def listing(self, request):
        p = request.query_params
        try:
            size = int(p.get("page_size", 1000))
        except ValueError:
            raise ApiError(400, "page_size must be an integer") from None
        return self.server.list(p.get("prefix", ""), p.get("cursor"), max(1, min(size, 1000)))

    async def stats(self, request):
        return reply({**self.server.stats, "namespaces": len(self.server.namespaces)})

    async def reset_stats(self, request):
        self.server.stats.clear()
        return reply({"status": "OK"})


async def not_found(request, exc):
    return reply({"status": "error", "error": f"no route {request.method} {request.url.path}"}, 404)


async def bad_method(request, exc):
    return reply({"status": "error", "error": f"method {request.method} not allowed on {request.url.path}"}, 405)


def app(server):
    from starlette.applications import Starlette
    from starlette.routing import Route

    h = Handlers(server)
    routes = [
        Route("/v2/namespaces/{ns}", h.wrap("write", h.write), methods=["POST"]),
        Route("/v2/namespaces/{ns}", h.wrap("delete", h.delete), methods=["DELETE"]),
        Route("/v2/namespaces/{ns}/query", h.wrap("query", h.query), methods=["POST"]),
        Route("/v1/namespaces/{ns}/metadata", h.wrap("metadata", h.metadata), methods=["GET"]),
        Route("/v2/namespaces/{ns}/metadata", h.wrap("metadata", h.metadata), methods=["GET"]),
        Route("/v1/namespaces/{ns}/schema", h.wrap("schema", h.schema), methods=["GET"]),
        Route("/v1/namespaces/{ns}/hint_cache_warm", h.wrap("warm", h.warm), methods=["GET"]),
        Route("/v1/namespaces", h.wrap("list", h.listing), methods=["GET"]),
        Route("/_local/stats", h.stats, methods=["GET"]),
        Route("/_local/stats", h.reset_stats, methods=["DELETE"]),
    ]
    return with_faults(server, Starlette(routes=routes, exception_handlers={404: not_found, 405: bad_method}))
