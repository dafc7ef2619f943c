"""A local server speaking the part of turbopuffer's v2 HTTP API that vecgpt uses (starlette + uvicorn).

    vecgpt tpuf-local --port 8765 [--latency-ms 25] [--float32] ...   (or: python -m vecgpt.tpuf_local ...)

Data live in memory. Vectors are held as float32 (lists and base64 `<f4` on the wire both round to
float32, as the service stores them); a distance is computed in float64 from those float32 values and
then rounded to float32, i.e. the exact float32 distance, or with `--float32` accumulated in float32 one
dimension after another (the service does not document its arithmetic; this is the worst plausible
order, and the tests run under it). `ANN` is answered by the same exhaustive scan as `kNN`, so it is
exact here (the real service is approximate).

What it implements, with the service's shapes and limits (see shared/reference/turbopuffer-api.md):
- POST /v2/namespaces/{ns}: upsert_rows, upsert_columns (base64 or list vectors), deletes,
  delete_by_filter, distance_metric (euclidean_squared | cosine_distance), schema, branch_from_namespace
  and copy_from_namespace (string or object form).
- POST /v2/namespaces/{ns}/query: rank_by ["vector","kNN"|"ANN",q] or [attr,"asc"|"desc"], filters
  (Eq NotEq In NotIn Lt Lte Gt Gte, And Or Not; Lt/Lte also match null, as documented), top_k / limit,
  include_attributes, vector_encoding; `queries` makes it a multi_query (at most 16).
- DELETE /v2/namespaces/{ns}; GET /v1|v2/namespaces/{ns}/metadata; GET /v1/namespaces/{ns}/schema;
  GET /v1/namespaces?prefix=&cursor=&page_size=; GET /v1/namespaces/{ns}/hint_cache_warm.
- Limits: names [A-Za-z0-9-_.]{1,128}; 10,752 dimensions; top_k <= 10,000; 16 subqueries; kNN needs a
  filter; 512 MB write bodies; 16 concurrency slots per namespace, where a kNN (sub)query takes 2, ANN
  and attribute-ordered queries 1, and every subquery of a multi_query counts (the query page). A query
  that finds no free slots waits up to 800 ms and then gets 429; one that needs more than 16 slots can
  never run and gets 429 at once with `x-should-retry: false`.
- gzip request bodies; the query string (`?stainless_overload=...`) is ignored; `prefer:
  respond-async` is ignored (answers are synchronous). Any bearer token is accepted unless
  `--api-key` is given, in which case others get 401.
- `--latency-ms` sleeps that long before handling every request, to stand in for the network;
  `--write-latency-ms` delays a write's (or delete's) reply and its visibility, the commit to object
  storage (the service: up to ~200 ms).
- What the service does not promise: `--list-lag-s S` makes listing lag S seconds behind creates and
  deletes, `--list-forbidden` answers it 403; `--index-lag-ms` keeps writes unindexed that long
  (metadata `index` says "updating" with `unindexed_rows`; a query's `exhaustive_search_count` is them).
- `--fail-rate P` (`--fail-seed`, `--fail-kinds 429,500,drop[,409]`): a seeded fraction of requests
  fails; "drop" handles the request and then aborts the connection, so the reply of a committed write
  is lost (module `faults`).
- GET /_local/stats (not part of turbopuffer): requests by kind, 429s, peak slots in use.

Modules: `limits` (limits, ApiError, name/id checks), `namespaces` (in-memory data, upsert, delete),
`filters` (filter evaluation), `writes` (write requests, branch/copy), `query` (kNN/ANN and attribute
order, multi_query, top_k), `slots` (concurrency-slot accounting), `server` (the state), `app` (starlette
routes, bodies, gzip, auth, latency), `faults` (injected failures), `serve` (sockets, `Running`,
command-line options).
"""

from __future__ import annotations

from vecgpt.tpuf_local.app import app, dumps, loads
from vecgpt.tpuf_local.filters import mask
from vecgpt.tpuf_local.limits import (MAX_BODY, MAX_DIMS, MAX_SUBQUERIES, MAX_TOP_K, METRICS, NAME, SLOT_WAIT_S,
                                      SLOTS, ApiError, check_name, valid_id)
from vecgpt.tpuf_local.namespaces import Namespace, decode_vectors, now, value_bytes
from vecgpt.tpuf_local.query import query_slots
from vecgpt.tpuf_local.serve import Running, add_arguments, listen, run_args, serve, server_options, uvicorn_server
from vecgpt.tpuf_local.server import Server
from vecgpt.tpuf_local.slots import Slots

__all__ = ["MAX_BODY", "MAX_DIMS", "MAX_SUBQUERIES", "MAX_TOP_K", "METRICS", "NAME", "SLOTS", "SLOT_WAIT_S",
           "ApiError", "Namespace", "Running", "Server", "Slots", "add_arguments", "app", "check_name",
           "decode_vectors", "dumps", "listen", "loads", "mask", "now", "query_slots", "run_args", "serve",
           "server_options", "uvicorn_server", "valid_id", "value_bytes"]
