"""Injected faults (`--fail-rate`): a seeded fraction of API requests answers 429 or 500 before it is
handled, or is handled and then loses its reply (the connection is dropped: a write has committed but the
client does not know), or (kind "409", off by default) is handled and then answers 409 Conflict, as a
create whose first attempt already landed would. An ASGI wrapper around the starlette app, so that a
dropped connection is a real one: the socket is aborted before any byte of the reply is sent."""

from __future__ import annotations

import asyncio
import random

from vecgpt.backends.turbopuffer.server.bodies import dumps

FAULTS = ("429", "500", "drop")
KINDS = FAULTS + ("409",)


class Faults:
    """Which requests fail, and how: `rate` of them, the kind drawn evenly from `kinds`, from `seed`."""

    def __init__(self, rate: float = 0.0, seed: int = 0, kinds=FAULTS):
        if not 0 <= rate < 1:
            raise ValueError(f"fail rate {rate} must be in [0, 1)")
        unknown = set(kinds) - set(KINDS)
        if unknown or not kinds:
            raise ValueError(f"fault kinds are {', '.join(KINDS)}; got {', '.join(sorted(unknown)) or 'none'}")
        self.rate, self.kinds, self.rng = rate, tuple(kinds), random.Random(seed)

    def draw(self) -> str | None:
        """The fault for the next request, or None (called on the event loop only: no lock needed)."""
        if not self.rate or self.rng.random() >= self.rate:
            return None
        return self.kinds[self.rng.randrange(len(self.kinds))]


def with_faults(server, inner):
    """The ASGI app `inner`, failing a fraction of the API requests as `server.faults` says."""

    async def app(scope, receive, send):
        kind = server.faults.draw() if scope["type"] == "http" and scope["path"].startswith("/v") else None
        if kind is None:
            return await inner(scope, receive, send)
        server.stats[f"fault_{kind}"] += 1
        if kind in ("429", "500"):
            return await _answer(send, int(kind), "injected fault (tpuf-local --fail-rate)")
        held = []

        async def hold(message):  # handle the request, keep its reply
            held.append(message)

        await inner(scope, receive, hold)
        if kind == "drop":
            return await _drop(send)
        if held and held[0].get("status", 500) < 300:
            return await _answer(send, 409, "conflict: injected after the request was applied")
        for message in held:  # it failed anyway: its own reply
            await send(message)

    return app


async def _answer(send, status: int, message: str) -> None:
    body = dumps({"status": "error", "error": message})
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _drop(send) -> None:
    """Abort the connection. uvicorn's `send` is a method of the request cycle, which holds the transport;
    once the loop has noticed the loss, returning without a reply is quiet."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if transport is None:  # another server: an unfinished reply makes it close the connection
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"100")]})
        return
    transport.abort()
    for _ in range(3):
        await asyncio.sleep(0)
