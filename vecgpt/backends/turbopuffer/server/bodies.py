"""JSON bodies: orjson where it is installed, else the standard library's json."""

from __future__ import annotations

try:
    import orjson

    def dumps(obj) -> bytes:
        return orjson.dumps(obj)

    loads = orjson.loads
except ImportError:  # pragma: no cover
    import json

    def dumps(obj) -> bytes:
        return json.dumps(obj).encode()

    loads = json.loads
