"""The HTTP side (starlette, imported when the app is built): routes, bearer auth, the simulated network and
commit latencies, a write's memory reserved before its body is read, error replies (out of memory: 507), and
GET|DELETE /_local/stats. Injected faults wrap the app (`faults`)."""

from __future__ import annotations

import asyncio
import contextlib

from vecgpt.backends.turbopuffer.server.bodies import body_of, drain, dumps, loads_write
from vecgpt.backends.turbopuffer.server.faults import with_faults
from vecgpt.backends.turbopuffer.server.limits import ApiError
from vecgpt.backends.turbopuffer.server.memory import WRITE_FACTOR, write_need
from vecgpt.backends.turbopuffer.server.query import slots_needed


def reply(obj, status=200, headers=None):
    from starlette.responses import Response

    return Response(dumps(obj), status_code=status, media_type="application/json", headers=headers)


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
            except MemoryError:
                await drain(request)  # a reply before the body's end would meet a client still sending
                return self.error(server.memory.exhausted(f"this {kind} request"))
            except ApiError as e:
                return self.error(e)

        return handle

    def error(self, e: ApiError):
        self.server.stats[f"status_{e.status}"] += 1
        return reply({"status": "error", "error": e.message}, e.status, e.headers)

    def authorize(self, auth: str) -> None:
        if not auth.startswith("Bearer ") or not auth[7:].strip():
            raise ApiError(401, "missing API key: send Authorization: Bearer <key>")
        if self.server.api_key is not None and auth[7:].strip() != self.server.api_key:
            raise ApiError(401, "invalid API key")

    async def write(self, request):
        from starlette.concurrency import run_in_threadpool

        name = request.path_params["ns"]
        with contextlib.ExitStack() as reserved:
            body = await self.admitted(request, name, reserved)
            await self.commit()
            return await run_in_threadpool(self.server.write, name, body)

    async def admitted(self, request, name: str, reserved: contextlib.ExitStack) -> dict:
        """A write's body, read once memory for it is reserved (held in `reserved` until the write is applied);
        refused (507), the body is still read to its end, so that the reply reaches a client still sending."""
        memory, size = self.server.memory, int(request.headers.get("content-length") or 0)
        what = f"a write of {size:,} bytes to {name!r}"
        try:
            reserved.enter_context(memory.reserve(write_need(size), what))
        except ApiError:
            await drain(request)
            raise

        def unpacked(extra: int) -> None:
            reserved.enter_context(memory.reserve(WRITE_FACTOR * extra, what + " (gzip)"))

        return await body_of(request, loads_write, unpacked)

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
