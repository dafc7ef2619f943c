"""A local server speaking the part of turbopuffer's v2 HTTP API that vecgpt uses (starlette + uvicorn).

    vecgpt tpuf-local --port 8765 [--latency-ms 25]      (or: python -m vecgpt.tpuf_local ...)

Data live in memory. Vectors are held as float32 (lists and base64 `<f4` on the wire both round to
float32, as the service stores them); a distance is computed in float64 from those float32 values and
then rounded to float32, i.e. the exact float32 distance. `ANN` is answered by the same exhaustive
scan as `kNN`, so it is exact here (the real service is approximate).

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
  and attribute-ordered queries 1, and every subquery of a multi_query counts (the conservative
  reading of the docs; `--slot-rule request` counts a multi_query once). A query that finds no free
  slots waits up to 800 ms and then gets 429; one that needs more than 16 slots can never run and gets
  429 at once with `x-should-retry: false`.
- gzip request bodies; the query string (`?stainless_overload=...`) is ignored; `prefer:
  respond-async` is ignored (answers are synchronous). Any bearer token is accepted unless
  `--api-key` is given, in which case others get 401.
- `--latency-ms` sleeps that long before handling every request, to stand in for the network.
- GET /_local/stats (not part of turbopuffer): requests by kind, 429s, peak slots in use.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import copy
import gzip
import re
import socket
import threading
import time
from collections import Counter
from datetime import datetime, timezone

import numpy as np

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

NAME = re.compile(r"[A-Za-z0-9\-_.]{1,128}\Z")
MAX_TOP_K = 10_000
MAX_SUBQUERIES = 16
MAX_DIMS = 10_752
MAX_BODY = 512_000_000
SLOTS = 16
SLOT_WAIT_S = 0.8
METRICS = ("euclidean_squared", "cosine_distance")


class ApiError(Exception):
    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def valid_id(value):
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ApiError(400, f"invalid id {value!r}: ids are unsigned integers, UUIDs or strings")
    if isinstance(value, int) and not 0 <= value < 2**64:
        raise ApiError(400, f"invalid id {value}: integer ids are u64")
    if isinstance(value, str) and len(value.encode()) > 64:
        raise ApiError(400, "invalid id: string ids are at most 64 bytes")
    return value


def value_bytes(v) -> int:
    if v is None:
        return 0
    if isinstance(v, str):
        return len(v.encode())
    if isinstance(v, list):
        return sum(value_bytes(x) for x in v)
    return 8


class Namespace:
    """One namespace: ids, float32 vectors (kept as float64 for BLAS), attribute columns."""

    def __init__(self, name: str):
        self.name = name
        self.ids: list = []
        self.slot_of: dict = {}
        self.dim: int | None = None
        self.metric: str | None = None
        self.vectors = np.zeros((0, 0))  # [capacity, dim] float64 holding float32 values
        self.norms = np.zeros(0)
        self.attrs: dict[str, list] = {}
        self.types: dict[str, str] = {}
        self.schema_extra: dict = {}
        self.attr_bytes = 0
        self.created_at = self.updated_at = now()
        self.version = 0
        self.lock = threading.RLock()
        self._columns: dict = {}

    @property
    def n(self) -> int:
        return len(self.ids)

    def logical_bytes(self) -> int:
        return self.n * (8 + 4 * (self.dim or 0)) + self.attr_bytes

    # writes -------------------------------------------------------------------------------
    def set_metric(self, metric, needed: bool) -> None:
        if metric is not None:
            if metric not in METRICS:
                raise ApiError(400, f"unknown distance_metric {metric!r}; expected one of {list(METRICS)}")
            if self.metric is not None and metric != self.metric:
                raise ApiError(400, f"namespace {self.name} uses distance_metric {self.metric!r}, not {metric!r}")
            self.metric = metric
        elif needed and self.metric is None:
            raise ApiError(400, "distance_metric is required when writing vectors to a new namespace")

    def _grow(self, extra: int) -> None:
        need = self.n + extra
        if need > len(self.vectors):
            cap = max(need, 2 * len(self.vectors), 16)
            grown = np.zeros((cap, self.dim))
            grown[: self.n] = self.vectors[: self.n]
            self.vectors = grown
            norms = np.zeros(cap)
            norms[: self.n] = self.norms[: self.n]
            self.norms = norms

    def upsert(self, ids: list, vectors: np.ndarray | None, attrs: dict[str, list]) -> None:
        if vectors is not None:
            if vectors.ndim != 2 or vectors.shape[1] == 0:
                raise ApiError(400, "vectors must be non-empty arrays of floats")
            dim = vectors.shape[1]
            if dim > MAX_DIMS:
                raise ApiError(400, f"vector has {dim} dimensions; the limit is {MAX_DIMS}")
            if self.dim is None:
                self.dim = dim
                self.vectors, self.norms = np.zeros((0, dim)), np.zeros(0)
            elif dim != self.dim:
                raise ApiError(400, f"vector dimension mismatch: namespace {self.name} holds [{self.dim}]f32, got [{dim}]")
        elif self.dim is not None and ids:
            raise ApiError(400, f"namespace {self.name} has a vector column; every upserted document needs a vector")
        for name, column in attrs.items():
            if name.startswith("$") or len(name.encode()) > 128:
                raise ApiError(400, f"invalid attribute name {name!r}")
            self._note_type(name, column)
        ids = [valid_id(i) for i in ids]
        if ids and self.ids and type(ids[0]) is not type(self.ids[0]):
            raise ApiError(400, "a namespace cannot mix id types")
        # last write of an id wins
        last = {i: r for r, i in enumerate(ids)}
        order = list(last.values())
        slots = [self.slot_of.get(ids[r], -1) for r in order]
        new_rows = [r for r, s in zip(order, slots) if s < 0]
        if self.dim is not None and vectors is not None:
            self._grow(len(new_rows))
        for name in set(attrs) | set(self.attrs):
            self.attrs.setdefault(name, [None] * self.n)
        start = self.n
        for r in new_rows:
            self.slot_of[ids[r]] = len(self.ids)
            self.ids.append(ids[r])
            for col in self.attrs.values():
                col.append(None)
        all_slots = [s if s >= 0 else start + k for s, k in zip(slots, _count_new(slots))]
        if vectors is not None:
            sel = np.asarray(order, np.int64)
            v = vectors[sel].astype(np.float64)
            idx = np.asarray(all_slots, np.int64)
            self.vectors[idx] = v
            self.norms[idx] = np.einsum("ij,ij->i", v, v)
        for name, col in self.attrs.items():
            given = attrs.get(name)
            for r, s in zip(order, all_slots):
                old = col[s]
                new = None if given is None else given[r]
                self.attr_bytes += value_bytes(new) - value_bytes(old)
                col[s] = new
        self._touch()

    def _note_type(self, name, column) -> None:
        for v in column:
            if v is None:
                continue
            t = ("bool" if isinstance(v, bool) else "int" if isinstance(v, int) else "float" if isinstance(v, float)
                 else "string" if isinstance(v, str) else "[]" + ("string" if v and isinstance(v[0], str) else "int")
                 if isinstance(v, list) else None)
            if t is None:
                raise ApiError(400, f"attribute {name!r}: unsupported value {v!r}")
            self.types.setdefault(name, t)
            break

    def delete(self, ids: list) -> int:
        done = 0
        for i in ids:
            s = self.slot_of.pop(i, None)
            if s is None:
                continue
            done += 1
            last = self.n - 1
            for col in self.attrs.values():
                self.attr_bytes -= value_bytes(col[s])
            if s != last:  # move the last row into the hole
                moved = self.ids[last]
                self.ids[s] = moved
                self.slot_of[moved] = s
                if self.dim is not None:
                    self.vectors[s], self.norms[s] = self.vectors[last], self.norms[last]
                for col in self.attrs.values():
                    col[s] = col[last]
            self.ids.pop()
            for col in self.attrs.values():
                col.pop()
        self._touch()
        return done

    def _touch(self) -> None:
        self.version += 1
        self._columns = {}
        self.updated_at = now()

    # reads --------------------------------------------------------------------------------
    def column(self, name: str):
        """(values, present) for an attribute or `id`: int64 where every value is an int, else objects."""
        cached = self._columns.get(name)
        if cached is not None:
            return cached
        raw = self.ids if name == "id" else self.attrs.get(name, [None] * self.n)
        present = np.fromiter((v is not None for v in raw), bool, len(raw))
        if all(isinstance(v, int) and not isinstance(v, bool) for v in raw if v is not None) and \
                all(-2**63 <= v < 2**63 for v in raw if v is not None):
            values = np.fromiter((0 if v is None else v for v in raw), np.int64, len(raw))
        else:
            values = np.empty(len(raw), object)
            values[:] = raw
        self._columns[name] = (values, present)
        return values, present

    def mask(self, f) -> np.ndarray:
        if not isinstance(f, list) or not f:
            raise ApiError(400, f"invalid filter {f!r}")
        if f[0] in ("And", "Or") and len(f) == 2:
            if not isinstance(f[1], list):
                raise ApiError(400, f"{f[0]} takes a list of filters")
            parts = [self.mask(g) for g in f[1]]
            if not parts:
                return np.full(self.n, f[0] == "And")
            return np.logical_and.reduce(parts) if f[0] == "And" else np.logical_or.reduce(parts)
        if f[0] == "Not" and len(f) == 2:
            return ~self.mask(f[1])
        if len(f) != 3 or not isinstance(f[0], str):
            raise ApiError(400, f"invalid filter {f!r}")
        attr, op, value = f
        values, present = self.column(attr)
        if op in ("Eq", "NotEq"):
            hit = ~present if value is None else present & _compare(values, present, "Eq", value)
            return hit if op == "Eq" else ~hit
        if op in ("In", "NotIn"):
            if not isinstance(value, list):
                raise ApiError(400, f"{op} takes a list")
            hit = present & (np.isin(values, value) if values.dtype != object else
                             np.fromiter((v in set(value) for v in values), bool, len(values)))
            return hit if op == "In" else ~hit
        if op in ("Lt", "Lte"):
            return ~present | _compare(values, present, op, value)
        if op in ("Gt", "Gte"):
            return present & _compare(values, present, op, value)
        raise ApiError(400, f"filter operator {op!r} is not supported by this local server")

    def snapshot(self):
        with self.lock:
            n = self.n
            return n, self.vectors[:n], self.norms[:n], list(self.ids)


def _count_new(slots):
    k = 0
    for s in slots:
        yield k
        if s < 0:
            k += 1


OPS = {"Eq": np.equal, "Lt": np.less, "Lte": np.less_equal, "Gt": np.greater, "Gte": np.greater_equal}


def _compare(values, present, op, value) -> np.ndarray:
    if values.dtype != object:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return np.zeros(len(values), bool)
        return OPS[op](values, value)
    fn = {"Eq": lambda a: a == value, "Lt": lambda a: a < value, "Lte": lambda a: a <= value,
          "Gt": lambda a: a > value, "Gte": lambda a: a >= value}[op]
    out = np.zeros(len(values), bool)
    for i, (v, p) in enumerate(zip(values, present)):
        if p:
            try:
                out[i] = fn(v)
            except TypeError:
                out[i] = False
    return out


def decode_vectors(column) -> np.ndarray | None:
    if column is None:
        return None
    if all(v is None for v in column):
        return None
    if any(v is None for v in column):
        raise ApiError(400, "every document needs a vector once the namespace has a vector column")
    try:
        if all(isinstance(v, str) for v in column):
            raw = [base64.b64decode(v, validate=True) for v in column]
            if len({len(r) for r in raw}) != 1 or len(raw[0]) % 4:
                raise ApiError(400, "base64 vectors must be little-endian f32 arrays of one length")
            return np.frombuffer(b"".join(raw), "<f4").reshape(len(raw), -1)
        return np.asarray(column, np.float32).reshape(len(column), -1) if len({len(v) for v in column}) == 1 \
            else _bad_vectors()
    except (ValueError, TypeError) as e:
        raise ApiError(400, f"invalid vector: {e}") from None


def _bad_vectors():
    raise ApiError(400, "vectors of one namespace must all have the same dimension")


def query_slots(q: dict) -> int:
    if "aggregate_by" in q:
        return 4
    rank = q.get("rank_by")
    if isinstance(rank, list) and len(rank) == 3 and rank[1] == "kNN":
        return 2
    return 1


class Server:
    """The namespaces and the request handlers (the starlette app is built by `app()`)."""

    def __init__(self, latency_ms: float = 0.0, api_key: str | None = None, max_top_k: int = MAX_TOP_K,
                 slots: int = SLOTS, slot_rule: str = "subquery"):
        self.latency = latency_ms / 1000
        self.api_key, self.max_top_k, self.slots, self.slot_rule = api_key, max_top_k, slots, slot_rule
        self.namespaces: dict[str, Namespace] = {}
        self.lock = threading.Lock()
        self.stats = Counter()
        self.in_use: Counter = Counter()
        self.conditions: dict[str, asyncio.Condition] = {}

    # namespaces ---------------------------------------------------------------------------
    def get(self, name: str) -> Namespace:
        check_name(name)
        ns = self.namespaces.get(name)
        if ns is None:
            raise ApiError(404, f"namespace '{name}' was not found")
        return ns

    def get_or_create(self, name: str) -> Namespace:
        check_name(name)
        with self.lock:
            if name not in self.namespaces:
                self.namespaces[name] = Namespace(name)
            return self.namespaces[name]

    # slots --------------------------------------------------------------------------------
    async def acquire(self, name: str, need: int) -> None:
        if need > self.slots:
            self.stats["429"] += 1
            raise ApiError(429, f"this query needs {need} concurrency slots; a namespace has {self.slots} "
                                f"(a kNN subquery takes 2)", {"x-should-retry": "false"})
        cond = self.conditions.setdefault(name, asyncio.Condition())
        async with cond:
            try:
                await asyncio.wait_for(cond.wait_for(lambda: self.in_use[name] + need <= self.slots), SLOT_WAIT_S)
            except asyncio.TimeoutError:
                self.stats["429"] += 1
                raise ApiError(429, f"too many concurrent queries on namespace '{name}'") from None
            self.in_use[name] += need
            self.stats["peak_slots"] = max(self.stats["peak_slots"], self.in_use[name])

    async def release(self, name: str, need: int) -> None:
        cond = self.conditions[name]
        async with cond:
            self.in_use[name] -= need
            cond.notify_all()

    # writes -------------------------------------------------------------------------------
    def write(self, name: str, body: dict) -> dict:
        start = time.perf_counter()
        for key in ("branch_from_namespace", "copy_from_namespace"):
            if key in body:
                src = body[key]
                src = src.get("source_namespace") if isinstance(src, dict) else src
                return self.clone(name, src, empty_only=key == "copy_from_namespace")
        unknown = set(body) - {"upsert_rows", "upsert_columns", "deletes", "delete_by_filter", "distance_metric",
                               "schema", "disable_backpressure", "return_affected_ids"}
        if unknown:
            raise ApiError(400, f"this local server does not implement write field {sorted(unknown)[0]!r}")
        ns = self.get_or_create(name)
        written = upserted = deleted = 0
        with ns.lock:
            has_vectors = False
            if "schema" in body:
                if not isinstance(body["schema"], dict):
                    raise ApiError(400, "schema must be an object")
                ns.schema_extra.update(body["schema"])
            if "delete_by_filter" in body:
                gone = [ns.ids[s] for s in np.flatnonzero(ns.mask(body["delete_by_filter"]))]
                deleted += ns.delete(gone)
            batches = []
            if "upsert_rows" in body:
                rows = body["upsert_rows"]
                if not isinstance(rows, list) or any(not isinstance(r, dict) or "id" not in r for r in rows):
                    raise ApiError(400, "upsert_rows must be a list of objects, each with an id")
                names = sorted({k for r in rows for k in r} - {"id", "vector"})
                vecs = [r.get("vector") for r in rows]
                batches.append(([r["id"] for r in rows], vecs, {k: [r.get(k) for r in rows] for k in names}))
            if "upsert_columns" in body:
                cols = body["upsert_columns"]
                if not isinstance(cols, dict) or "id" not in cols:
                    raise ApiError(400, "upsert_columns must be an object of columns, with an id column")
                lengths = {len(v) for v in cols.values() if isinstance(v, list)}
                if len(lengths) != 1 or any(not isinstance(v, list) for v in cols.values()):
                    raise ApiError(400, "upsert_columns: every column must be an array of the same length")
                batches.append((cols["id"], cols.get("vector"),
                                {k: v for k, v in cols.items() if k not in ("id", "vector")}))
            for ids, vecs, attrs in batches:
                vectors = decode_vectors(vecs)
                has_vectors |= vectors is not None
                ns.set_metric(body.get("distance_metric"), needed=vectors is not None)
                ns.upsert(ids, vectors, attrs)
                upserted += len(ids)
                written += len(ids) * (8 + (0 if vectors is None else 4 * vectors.shape[1])) + \
                    sum(value_bytes(v) for col in attrs.values() for v in col)
            if not batches and "distance_metric" in body:
                ns.set_metric(body["distance_metric"], needed=False)
            if "deletes" in body:
                if not isinstance(body["deletes"], list):
                    raise ApiError(400, "deletes must be a list of ids")
                deleted += ns.delete([valid_id(i) for i in body["deletes"]])
        return {"status": "OK", "message": f"{upserted + deleted} rows affected", "rows_affected": upserted + deleted,
                "rows_upserted": upserted, "rows_deleted": deleted,
                "billing": {"billable_logical_bytes_written": written},
                "performance": {"server_total_ms": round(1000 * (time.perf_counter() - start), 3)}}

    def clone(self, name: str, source: str, empty_only: bool) -> dict:
        src = self.get(source)
        check_name(name)
        with self.lock:
            if name in self.namespaces and (empty_only or self.namespaces[name].n):
                raise ApiError(400 if empty_only else 409, f"namespace '{name}' already exists")
            with src.lock:
                dst = Namespace(name)
                for key in ("ids", "dim", "metric", "attrs", "types", "schema_extra", "attr_bytes"):
                    setattr(dst, key, copy.deepcopy(getattr(src, key)))
                dst.slot_of = dict(src.slot_of)
                dst.vectors, dst.norms = src.vectors[: src.n].copy(), src.norms[: src.n].copy()
            self.namespaces[name] = dst
        return {"status": "OK", "message": "namespace copied", "rows_affected": dst.n,
                "billing": {"billable_logical_bytes_written": 0}}

    def delete(self, name: str) -> dict:
        self.get(name)
        with self.lock:
            self.namespaces.pop(name, None)
        return {"status": "OK"}

    # queries ------------------------------------------------------------------------------
    def query(self, name: str, body: dict) -> dict:
        start = time.perf_counter()
        ns = self.get(name)
        with ns.lock:  # one snapshot for every subquery
            n, vectors, norms, ids = ns.snapshot()
            if "queries" in body:
                results = [self._one(ns, q, n, vectors, norms, ids, body) for q in body["queries"]]
            else:
                results = [self._one(ns, body, n, vectors, norms, ids, body)]
        returned = sum(r.pop("_bytes") for r in results)
        out = {"billing": {"billable_logical_bytes_queried": ns.logical_bytes() * len(results),
                           "billable_logical_bytes_returned": returned},
               "performance": {"approx_namespace_size": n, "cache_hit_ratio": 1.0, "cache_temperature": "hot",
                               "exhaustive_search_count": n, "query_execution_ms": round(1000 * (time.perf_counter() - start), 3),
                               "server_total_ms": round(1000 * (time.perf_counter() - start), 3)}}
        if "queries" in body:
            out["results"] = results
        else:
            out.update(results[0])
        return out

    def _one(self, ns: Namespace, q: dict, n, vectors, norms, ids, root: dict) -> dict:
        if not isinstance(q, dict):
            raise ApiError(400, "each query must be an object")
        unsupported = set(q) & {"aggregate_by", "group_by", "rerank_by", "compute_attributes"}
        if unsupported:
            raise ApiError(400, f"this local server does not implement {sorted(unsupported)[0]!r}")
        limit = q.get("top_k", q.get("limit"))
        if isinstance(limit, dict):
            limit = limit.get("total")
        if limit is None:
            limit = 10
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ApiError(400, f"invalid top_k/limit {limit!r}")
        if limit > self.max_top_k:
            raise ApiError(400, f"top_k/limit {limit} exceeds the maximum of {self.max_top_k}")
        offset = q.get("offset") or 0
        rank = q.get("rank_by")
        filters = q.get("filters")
        keep = ns.mask(filters) if filters is not None else None
        chosen = np.flatnonzero(keep) if keep is not None else np.arange(n)
        dists = None
        if not isinstance(rank, list) or len(rank) < 2:
            raise ApiError(400, "rank_by is required (e.g. [\"vector\", \"kNN\", [..]] or [\"id\", \"asc\"])")
        if len(rank) == 3 and rank[1] in ("kNN", "ANN"):
            if rank[0] != "vector":
                raise ApiError(400, f"no vector attribute {rank[0]!r}; vectors live in 'vector'")
            if rank[1] == "kNN" and filters is None:
                raise ApiError(400, "kNN (exact) queries require filters")
            if ns.dim is None:
                raise ApiError(400, f"namespace {ns.name} has no vectors")
            try:
                qv = np.asarray(rank[2], np.float32).astype(np.float64)
            except (ValueError, TypeError):
                raise ApiError(400, "the query vector must be an array of floats") from None
            if qv.shape != (ns.dim,):
                raise ApiError(400, f"query vector has {qv.size} dimensions; the namespace holds [{ns.dim}]f32")
            if len(chosen) == n:  # every row: no copy
                data, nrm = vectors, norms
            elif len(chosen) and chosen[-1] - chosen[0] == len(chosen) - 1:  # a contiguous run: a view
                data, nrm = vectors[chosen[0]:chosen[-1] + 1], norms[chosen[0]:chosen[-1] + 1]
            else:
                data, nrm = vectors[chosen], norms[chosen]
            dots = data @ qv
            if ns.metric == "cosine_distance":
                denom = np.sqrt(nrm * (qv @ qv))
                d = 1.0 - np.divide(dots, denom, out=np.zeros_like(dots), where=denom > 0)
            else:
                d = np.maximum(nrm + qv @ qv - 2.0 * dots, 0.0)
            d = d.astype(np.float32)  # the exact distance, rounded to float32
            want = min(limit + offset, len(d))
            if want < len(d):
                part = np.argpartition(d, want - 1)[:want] if want else np.zeros(0, np.int64)
            else:
                part = np.arange(len(d))
            order = part[np.argsort(d[part], kind="stable")][offset:]
            chosen, dists = chosen[order], d[order]
        elif len(rank) == 2 and rank[1] in ("asc", "desc"):
            values, present = ns.column(rank[0])
            sub = values[chosen]
            order = np.argsort(sub, kind="stable") if sub.dtype != object else \
                np.array(sorted(range(len(sub)), key=lambda i: (sub[i] is None, sub[i])), np.int64)
            if rank[1] == "desc":
                order = order[::-1]
            chosen = chosen[order][offset: offset + limit]
        else:
            raise ApiError(400, f"this local server does not implement rank_by {rank[:2]!r}")
        include = q.get("include_attributes", False)
        if include is True:
            names = ["vector", *ns.attrs] if ns.dim else list(ns.attrs)
        elif isinstance(include, list):
            names = [a for a in include if a != "id"]
        else:
            names = []
        encoding = root.get("vector_encoding", q.get("vector_encoding", "float"))
        rows, returned = [], 0
        id_list = [ids[s] for s in chosen.tolist()]
        returned += 8 * len(id_list)
        if dists is not None:
            dl = dists.tolist()
            returned += 4 * len(dl)
            rows = [{"id": i, "$dist": x} for i, x in zip(id_list, dl)]
        else:
            rows = [{"id": i} for i in id_list]
        for a in names:
            if a == "vector":
                if ns.dim is None:
                    continue
                v32 = vectors[chosen].astype("<f4")
                returned += v32.nbytes
                if encoding == "base64":
                    vals = [base64.b64encode(r.tobytes()).decode() for r in v32]
                else:
                    vals = v32.tolist()
            else:
                col = ns.attrs.get(a)
                if col is None:
                    continue
                vals = [col[s] for s in chosen.tolist()]
                returned += sum(value_bytes(v) for v in vals)
            for row, v in zip(rows, vals):
                if v is not None:
                    row[a] = v
        return {"rows": rows, "_bytes": returned}

    def metadata(self, name: str) -> dict:
        ns = self.get(name)
        with ns.lock:
            return {"approx_logical_bytes": ns.logical_bytes(), "approx_row_count": ns.n,
                    "created_at": ns.created_at, "updated_at": ns.updated_at,
                    "encryption": {"mode": "default"}, "index": {"status": "up-to-date"},
                    "schema": self.schema(name)}

    def schema(self, name: str) -> dict:
        ns = self.get(name)
        out = {"id": {"type": "uint" if not ns.ids or isinstance(ns.ids[0], int) else "string"}}
        if ns.dim is not None:
            out["vector"] = {"type": f"[{ns.dim}]f32", "ann": {"distance_metric": ns.metric}}
        for a, t in ns.types.items():
            out[a] = {"type": t}
        for a, spec in ns.schema_extra.items():
            out[a] = {**out.get(a, {}), **(spec if isinstance(spec, dict) else {"type": spec})}
        return out

    def list(self, prefix: str, cursor: str | None, page_size: int) -> dict:
        names = sorted(n for n in self.namespaces if n.startswith(prefix) and (cursor is None or n > cursor))
        page = names[:page_size]
        return {"namespaces": [{"id": n} for n in page],
                "next_cursor": page[-1] if len(names) > page_size else None}


def check_name(name: str) -> None:
    if not NAME.match(name):
        raise ApiError(400, f"invalid namespace name {name!r}: use [A-Za-z0-9-_.], 1 to 128 characters")


def app(server: Server):
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    def reply(obj, status=200, headers=None):
        return Response(dumps(obj), status_code=status, media_type="application/json", headers=headers)

    async def body_of(request: Request) -> dict:
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

    def handler(kind, fn):
        async def handle(request: Request):
            server.stats["requests"] += 1
            server.stats[kind] += 1
            try:
                if server.latency:
                    await asyncio.sleep(server.latency)
                auth = request.headers.get("authorization", "")
                if not auth.startswith("Bearer ") or not auth[7:].strip():
                    raise ApiError(401, "missing API key: send Authorization: Bearer <key>")
                if server.api_key is not None and auth[7:].strip() != server.api_key:
                    raise ApiError(401, "invalid API key")
                return reply(await fn(request))
            except ApiError as e:
                server.stats[f"status_{e.status}"] += 1
                return reply({"status": "error", "error": e.message}, e.status, e.headers)
        return handle

    async def write(request):
        name = request.path_params["ns"]
        body = await body_of(request)
        return await run_in_threadpool(server.write, name, body)

    async def query(request):
        name = request.path_params["ns"]
        body = await body_of(request)
        server.get(name)
        if "queries" in body:
            qs = body["queries"]
            if not isinstance(qs, list) or not qs:
                raise ApiError(400, "queries must be a non-empty list")
            if len(qs) > MAX_SUBQUERIES:
                raise ApiError(400, f"a multi-query takes at most {MAX_SUBQUERIES} queries, got {len(qs)}")
            extra = set(body) - {"queries", "consistency", "vector_encoding", "limit", "offset", "rerank_by"}
            if extra:
                raise ApiError(400, f"queries cannot be combined with top-level {sorted(extra)[0]!r}")
            per = [query_slots(q) if isinstance(q, dict) else 1 for q in qs]
            need = sum(per) if server.slot_rule == "subquery" else max(per)
            server.stats["subqueries"] += len(qs)
        else:
            need = query_slots(body)
            server.stats["subqueries"] += 1
        await server.acquire(name, need)
        try:
            return await run_in_threadpool(server.query, name, body)
        finally:
            await server.release(name, need)

    async def delete(request):
        return server.delete(request.path_params["ns"])

    async def metadata(request):
        return server.metadata(request.path_params["ns"])

    async def schema(request):
        return server.schema(request.path_params["ns"])

    async def warm(request):
        server.get(request.path_params["ns"])
        return {"status": "ACCEPTED"}

    async def listing(request):
        p = request.query_params
        try:
            size = int(p.get("page_size", 1000))
        except ValueError:
            raise ApiError(400, "page_size must be an integer") from None
        return server.list(p.get("prefix", ""), p.get("cursor"), max(1, min(size, 1000)))

    async def stats(request):
        return {**server.stats, "namespaces": len(server.namespaces)}

    async def reset_stats(request):
        server.stats.clear()
        return {"status": "OK"}

    routes = [
        Route("/v2/namespaces/{ns}", handler("write", write), methods=["POST"]),
        Route("/v2/namespaces/{ns}", handler("delete", delete), methods=["DELETE"]),
        Route("/v2/namespaces/{ns}/query", handler("query", query), methods=["POST"]),
        Route("/v1/namespaces/{ns}/metadata", handler("metadata", metadata), methods=["GET"]),
        Route("/v2/namespaces/{ns}/metadata", handler("metadata", metadata), methods=["GET"]),
        Route("/v1/namespaces/{ns}/schema", handler("schema", schema), methods=["GET"]),
        Route("/v1/namespaces/{ns}/hint_cache_warm", handler("warm", warm), methods=["GET"]),
        Route("/v1/namespaces", handler("list", listing), methods=["GET"]),
        Route("/_local/stats", stats, methods=["GET"]),
        Route("/_local/stats", reset_stats, methods=["DELETE"]),
    ]

    async def not_found(request, exc):
        return reply({"status": "error", "error": f"no route {request.method} {request.url.path}"}, 404)

    async def bad_method(request, exc):
        return reply({"status": "error", "error": f"method {request.method} not allowed on {request.url.path}"}, 405)

    return Starlette(routes=routes, exception_handlers={404: not_found, 405: bad_method})


def listen(host: str, port: int) -> socket.socket:
    """A listening socket with TCP_NODELAY, which accepted sockets inherit: the response's headers and body
    go out as two writes, and without it Nagle plus the peer's delayed ACK stall each reply by ~40 ms."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    return sock


def uvicorn_server(server: Server):
    import uvicorn

    config = uvicorn.Config(app(server), log_level="warning", access_log=False, lifespan="off")
    return uvicorn.Server(config)


class Running:
    """A server on a loopback port in a background thread: `url`, `server` (the data), `stop()`."""

    def __init__(self, port: int = 0, host: str = "127.0.0.1", **kw):
        self.server = Server(**kw)
        sock = listen(host, port)
        self.port = sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self._uv = uvicorn_server(self.server)
        self._uv.install_signal_handlers = lambda: None  # not the main thread
        self._thread = threading.Thread(target=self._uv.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._uv.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the local turbopuffer server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self._uv.should_exit = True
        self._thread.join(timeout=5)


def serve(port: int, host: str = "127.0.0.1", **kw) -> None:
    """Run in the foreground until interrupted."""
    sock = listen(host, port)
    print(f"turbopuffer-compatible server on http://{host}:{sock.getsockname()[1]} (latency {kw.get('latency_ms', 0)} ms); "
          f"set base_url to it and TURBOPUFFER_API_KEY to anything", flush=True)
    uvicorn_server(Server(**kw)).run(sockets=[sock])


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--latency-ms", type=float, default=0.0, help="delay added to every request (simulated network)")
    p.add_argument("--api-key", default=None, help="accept only this bearer token (default: any)")
    p.add_argument("--max-top-k", type=int, default=MAX_TOP_K, help="rows per query (the service allows 10,000)")
    p.add_argument("--slot-rule", choices=["subquery", "request"], default="subquery",
                   help="count every multi_query subquery against the 16 slots (default) or the request once")


def run_args(args) -> int:
    serve(args.port, args.host, latency_ms=args.latency_ms, api_key=args.api_key, max_top_k=args.max_top_k,
          slot_rule=args.slot_rule)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m vecgpt.tpuf_local", description=__doc__.split("\n")[0])
    add_arguments(parser)
    raise SystemExit(run_args(parser.parse_args()))
