"""POST /v2/namespaces/{ns}/query: kNN/ANN (both an exact scan here) or ordering by an attribute, filters,
top_k / limit, include_attributes, vector_encoding; `queries` makes it a multi_query, answered from one
snapshot. Also the concurrency slots a query takes."""

from __future__ import annotations

import base64
import time

import numpy as np

from vecgpt.backends.turbopuffer.server.limits import MAX_SUBQUERIES, ApiError, value_bytes
from vecgpt.backends.turbopuffer.server.namespaces import Namespace

MULTI_FIELDS = {"queries", "consistency", "vector_encoding", "limit", "offset", "rerank_by"}
UNSUPPORTED = {"aggregate_by", "group_by", "rerank_by", "compute_attributes"}


def query_slots(q: dict) -> int:
    if "aggregate_by" in q:
        return 4
    rank = q.get("rank_by")
    if isinstance(rank, list) and len(rank) == 3 and rank[1] == "kNN":
        return 2
    return 1


def slots_needed(body: dict) -> tuple[int, int]:
    """(slots, subqueries) for a query body, every subquery counted (the service's query page: each
    subquery counts against the limit); a malformed multi_query is refused here, before it waits."""
    if "queries" not in body:
        return query_slots(body), 1
    qs = body["queries"]
    if not isinstance(qs, list) or not qs:
        raise ApiError(400, "queries must be a non-empty list")
    if len(qs) > MAX_SUBQUERIES:
        raise ApiError(400, f"a multi-query takes at most {MAX_SUBQUERIES} queries, got {len(qs)}")
    extra = set(body) - MULTI_FIELDS
    if extra:
        raise ApiError(400, f"queries cannot be combined with top-level {sorted(extra)[0]!r}")
    per = [query_slots(q) if isinstance(q, dict) else 1 for q in qs]
    return sum(per), len(qs)


def query(ns: Namespace, body: dict, max_top_k: int, float32: bool = False) -> dict:
    start = time.perf_counter()
    with ns.lock:  # one snapshot for every subquery
        snap = ns.snapshot()
        qs = body["queries"] if "queries" in body else [body]
        results = [one(ns, q, snap, body, max_top_k, float32, place) for place, q in enumerate(qs)]
        unindexed = ns.index_status().get("unindexed_rows", 0)
    n = snap[0]
    returned = sum(r.pop("_bytes") for r in results)
    out = {
        "billing": {
            "billable_logical_bytes_queried": ns.logical_bytes() * len(results),
            "billable_logical_bytes_returned": returned,
        },
        "performance": {
            "approx_namespace_size": n,
            "cache_hit_ratio": 1.0,
            "cache_temperature": "hot",
            "exhaustive_search_count": min(unindexed, n),
            "query_execution_ms": round(1000 * (time.perf_counter() - start), 3),
            "server_total_ms": round(1000 * (time.perf_counter() - start), 3),
        },
    }
    if "queries" in body:
        out["results"] = results
    else:
        out.update(results[0])
    return out


def one(ns: Namespace, q: dict, snap: tuple, root: dict, max_top_k: int, float32: bool = False, place: int = 0) -> dict:
    """One (sub)query against a snapshot (n, rows, ids): {"rows": [...], "_bytes": returned}; `place`: its place in
    a multi_query (0: a query alone)."""
    if not isinstance(q, dict):
        raise ApiError(400, "each query must be an object")
    unsupported = set(q) & UNSUPPORTED
    if unsupported:
        raise ApiError(400, f"this local server does not implement {sorted(unsupported)[0]!r}")
    limit = _limit(q, max_top_k)
    offset = q.get("offset") or 0
    rank = q.get("rank_by")
    filters = q.get("filters")
    keep = ns.mask(filters) if filters is not None else None
    chosen = np.flatnonzero(keep) if keep is not None else np.arange(snap[0])
    dists = None
    if not isinstance(rank, list) or len(rank) < 2:
        raise ApiError(400, 'rank_by is required (e.g. ["vector", "kNN", [..]] or ["id", "asc"])')
    if len(rank) == 3 and rank[1] in ("kNN", "ANN"):
        chosen, dists = _by_vector(ns, rank, filters, chosen, snap, limit, offset, float32, place)
    elif len(rank) == 2 and rank[1] in ("asc", "desc"):
        chosen = _by_attribute(ns, rank, chosen, limit, offset)
    else:
        raise ApiError(400, f"this local server does not implement rank_by {rank[:2]!r}")
    encoding = root.get("vector_encoding", q.get("vector_encoding", "float"))
    return _rows(ns, chosen, dists, _included(ns, q), snap, encoding)


def _limit(q: dict, max_top_k: int) -> int:
    limit = q.get("top_k", q.get("limit"))
    if isinstance(limit, dict):
        limit = limit.get("total")
    if limit is None:
        limit = 10
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ApiError(400, f"invalid top_k/limit {limit!r}")
    if limit > max_top_k:
        raise ApiError(400, f"top_k/limit {limit} exceeds the maximum of {max_top_k}")
    return limit


def _by_vector(ns, rank, filters, chosen, snap, limit, offset, float32=False, place=0):
    """(rows, float32 distances) of the nearest `limit` after `offset` among `chosen`: an exact scan, a block of rows
    at a time (--float32: the sum begun at dimension `place`, see _distances32)."""
    n, rows, _ = snap
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
    if float32:
        parts = [_distances32(ns.metric, cols, qv, place) for cols, _ in rows.blocks(chosen, n)]
        d = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    else:
        d = _distances(ns.metric, *_dots(rows, chosen, n, qv), qv)
    want = min(limit + offset, len(d))
    if want < len(d):
        part = np.argpartition(d, want - 1)[:want] if want else np.zeros(0, np.int64)
    else:
        part = np.arange(len(d))
    order = part[np.argsort(d[part], kind="stable")][offset:]
    return chosen[order], d[order]


def _dots(rows, chosen, n, qv) -> tuple[np.ndarray, np.ndarray]:
    """(float64 dot products with `qv`, squared norms) of the `chosen` rows, a block of rows widened to float64 at a
    time."""
    dots, norms, at = np.empty(len(chosen)), np.empty(len(chosen)), 0
    for cols, nrm in rows.blocks(chosen, n, rows.block):
        dots[at : at + len(nrm)], norms[at : at + len(nrm)] = qv @ cols.astype(np.float64), nrm
        at += len(nrm)
    return dots, norms


def _distances(metric, dots, nrm, qv) -> np.ndarray:
    """The exact distance, computed in float64 from float32 values and rounded to float32 once."""
    if metric == "cosine_distance":
        denom = np.sqrt(nrm * (qv @ qv))
        d = 1.0 - np.divide(dots, denom, out=np.zeros_like(dots), where=denom > 0)
    else:
        d = np.maximum(nrm + qv @ qv - 2.0 * dots, 0.0)
    return d.astype(np.float32)


def _distances32(metric, cols, qv, place: int = 0) -> np.ndarray:
    """The distance of float32 rows given by dimension [dim, rows], accumulated in float32 one dimension after
    another (plain sequential order, the worst of the plausible orders): `tpuf-local --float32`. Each step is
    one correctly rounded float32 operation, so the result is the same on every CPU. Subquery `place` of a
    multi_query starts at dimension `place` (mod dim) and wraps around: the service does not say that a subquery
    is computed as the same query alone, so here a query's bits depend on what shares its request (never kinder
    than the service; texts sharing rounds are held to the tolerance rule there, tests/test_batch.py)."""
    q = qv.astype(np.float32)
    dims = np.roll(np.arange(len(q)), -place)  # 0, 1, ... alone; place, place + 1, ..., 0, ... in a multi_query
    acc = np.zeros(cols.shape[1], np.float32)
    if metric == "cosine_distance":
        dd, qq = np.zeros_like(acc), np.float32(0)
        for j in dims:
            acc += cols[j] * q[j]
            dd += cols[j] * cols[j]
            qq += q[j] * q[j]
        denom = np.sqrt(dd * qq)
        return np.float32(1) - np.divide(acc, denom, out=np.zeros_like(acc), where=denom > 0)
    for j in dims:
        diff = cols[j] - q[j]
        acc += diff * diff
    return acc


def _by_attribute(ns, rank, chosen, limit, offset):
    values, present = ns.column(rank[0])
    sub = values[chosen]
    order = (
        np.argsort(sub, kind="stable")
        if sub.dtype != object
        else np.array(sorted(range(len(sub)), key=lambda i: (sub[i] is None, sub[i])), np.int64)
    )
    if rank[1] == "desc":
        order = order[::-1]
    return chosen[order][offset : offset + limit]


def _included(ns, q) -> list[str]:
    include = q.get("include_attributes", False)
    if include is True:
        return ["vector", *ns.attrs] if ns.dim else list(ns.attrs)
    if isinstance(include, list):
        return [a for a in include if a != "id"]
    return []


def _rows(ns, chosen, dists, names, snap, encoding) -> dict:
    _, stored, ids = snap
    id_list = [ids[s] for s in chosen.tolist()]
    returned = 8 * len(id_list)
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
            v32 = stored.get(chosen).astype("<f4", copy=False)
            returned += v32.nbytes
            vals = [base64.b64encode(r.tobytes()).decode() for r in v32] if encoding == "base64" else v32.tolist()
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
