"""A local server speaking the part of turbopuffer's v2 HTTP API that vecgpt uses (starlette + uvicorn).

    vecgpt tpuf-local --port 8765 [--latency-ms 25] [--float32] ...
    python -m vecgpt.backends.turbopuffer.server ...   (the same)

Reads no environment variables. What it implements, its limits, arithmetic and injected faults:
docs/turbopuffer.md ("Local server").

Modules: `limits` (limits, ApiError, name/id checks), `namespaces` (in-memory data, upsert, delete),
`vectors` (float32 rows in chunks), `filters` (filter evaluation), `writes` (write requests, branch/copy),
`query` (kNN/ANN and attribute order, multi_query, top_k), `slots` (concurrency-slot accounting), `memory`
(room left, a write's reservation, 507), `state` (the server state), `app` (starlette routes, auth, latency),
`bodies` (reading, gunzipping and parsing bodies), `faults` (injected failures), `serve` (sockets, `Running`,
command-line options).
"""

from __future__ import annotations

from vecgpt.backends.turbopuffer.server.app import app
from vecgpt.backends.turbopuffer.server.bodies import dumps, loads
from vecgpt.backends.turbopuffer.server.filters import mask
from vecgpt.backends.turbopuffer.server.limits import (
    MAX_BODY,
    MAX_DIMS,
    MAX_SUBQUERIES,
    MAX_TOP_K,
    METRICS,
    NAME,
    SLOT_WAIT_S,
    SLOTS,
    ApiError,
    check_name,
    valid_id,
    value_bytes,
)
from vecgpt.backends.turbopuffer.server.namespaces import Namespace, decode_vectors, now
from vecgpt.backends.turbopuffer.server.query import query_slots
from vecgpt.backends.turbopuffer.server.serve import (
    Running,
    add_arguments,
    listen,
    run_args,
    serve,
    server_options,
    uvicorn_server,
)
from vecgpt.backends.turbopuffer.server.slots import Slots
from vecgpt.backends.turbopuffer.server.state import Server

__all__ = [
    "MAX_BODY",
    "MAX_DIMS",
    "MAX_SUBQUERIES",
    "MAX_TOP_K",
    "METRICS",
    "NAME",
    "SLOTS",
    "SLOT_WAIT_S",
    "ApiError",
    "Namespace",
    "Running",
    "Server",
    "Slots",
    "add_arguments",
    "app",
    "check_name",
    "decode_vectors",
    "dumps",
    "listen",
    "loads",
    "mask",
    "now",
    "query_slots",
    "run_args",
    "serve",
    "server_options",
    "uvicorn_server",
    "valid_id",
    "value_bytes",
]
