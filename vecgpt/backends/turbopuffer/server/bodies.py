"""Bodies: a request's read into one buffer, gunzipped within MAX_BODY and parsed as a JSON object; replies as
JSON. orjson where it is installed, else the standard library's json; a write's body is parsed by the standard
library (as fast for base64 vectors), which out of memory raises MemoryError where orjson can crash."""

from __future__ import annotations

import json
import zlib

from vecgpt.backends.turbopuffer.server.limits import MAX_BODY, ApiError

try:
    import orjson

    def dumps(obj) -> bytes:
        return orjson.dumps(obj)

    loads = orjson.loads
except ImportError:  # pragma: no cover

    def dumps(obj) -> bytes:
        return json.dumps(obj).encode()

    loads = json.loads


def _constant(name: str):
    raise ValueError(f"{name} is not JSON")


def loads_write(raw):
    return json.loads(raw, parse_constant=_constant)


async def body_of(request, parse=loads, unpacked=None) -> dict:
    """The request's JSON object, gunzipped if sent with `content-encoding: gzip` (`unpacked(extra)` then hears the
    bytes that added), parsed by `parse`."""
    raw = await read(request)
    if request.headers.get("content-encoding", "").lower() == "gzip":
        packed, raw = len(raw), gunzip(raw)
        if unpacked is not None:
            unpacked(len(raw) - packed)
    try:
        body = parse(raw) if raw else {}
    except ValueError:
        raise ApiError(400, "the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


async def read(request) -> bytearray:
    """The body in one buffer (not chunks joined into a second copy). Past MAX_BODY, 413, once the body has been
    read to its end: a reply sent sooner would meet a client still sending."""
    buf, size = bytearray(), 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            buf = bytearray()
        else:
            buf += chunk
    if size > MAX_BODY:
        raise ApiError(413, f"request body of {size} bytes exceeds {MAX_BODY}")
    return buf


async def drain(request) -> None:
    """Read what is left of the body and drop it (before an early reply)."""
    from starlette.requests import ClientDisconnect

    try:
        async for _ in request.stream():
            pass
    except (RuntimeError, ClientDisconnect):  # read already, or the client has gone
        pass


def gunzip(raw) -> bytes:
    """A gzip body unpacked, refused past MAX_BODY without unpacking the rest."""
    unpack = zlib.decompressobj(wbits=31)
    try:
        out = unpack.decompress(raw, MAX_BODY + 1)
    except zlib.error:
        raise ApiError(400, "the body is not valid gzip") from None
    if len(out) > MAX_BODY:
        raise ApiError(413, f"request body unpacks to more than {MAX_BODY} bytes")
    if not unpack.eof or unpack.unused_data:
        raise ApiError(400, "the body is not valid gzip")
    return out
