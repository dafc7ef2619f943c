"""POST /v2/namespaces/{ns}: upsert_rows, upsert_columns, deletes, delete_by_filter, distance_metric,
schema; branch_from_namespace and copy_from_namespace (string or object form)."""

from __future__ import annotations

import copy
import time

import numpy as np

from vecgpt.backends.turbopuffer.server.limits import ApiError, check_name, valid_id
from vecgpt.backends.turbopuffer.server.namespaces import Namespace, decode_vectors, value_bytes

FIELDS = {
    "upsert_rows",
    "upsert_columns",
    "deletes",
    "delete_by_filter",
    "distance_metric",
    "schema",
    "disable_backpressure",
    "return_affected_ids",
}


def write(server, name: str, body: dict) -> dict:
    start = time.perf_counter()
    for key in ("branch_from_namespace", "copy_from_namespace"):
        if key in body:
            src = body[key]
            src = src.get("source_namespace") if isinstance(src, dict) else src
            return clone(server, name, src, empty_only=key == "copy_from_namespace")
    unknown = set(body) - FIELDS
    if unknown:
        raise ApiError(400, f"this local server does not implement write field {sorted(unknown)[0]!r}")
    ns = server.get_or_create(name)
    with ns.lock:
        upserted, deleted, written = _apply(ns, body)
        ns.note_write(upserted, server.index_lag)
    return {
        "status": "OK",
        "message": f"{upserted + deleted} rows affected",
        "rows_affected": upserted + deleted,
        "rows_upserted": upserted,
        "rows_deleted": deleted,
        "billing": {"billable_logical_bytes_written": written},
        "performance": {"server_total_ms": round(1000 * (time.perf_counter() - start), 3)},
    }


def _apply(ns: Namespace, body: dict) -> tuple[int, int, int]:
    """(rows upserted, rows deleted, bytes written), in the service's order: schema, delete_by_filter,
    upserts, deletes."""
    written = upserted = deleted = 0
    if "schema" in body:
        if not isinstance(body["schema"], dict):
            raise ApiError(400, "schema must be an object")
        ns.schema_extra.update(body["schema"])
    if "delete_by_filter" in body:
        gone = [ns.ids[s] for s in np.flatnonzero(ns.mask(body["delete_by_filter"]))]
        deleted += ns.delete(gone)
    batches = _batches(body)
    for ids, vecs, attrs in batches:
        vectors = decode_vectors(vecs)
        ns.set_metric(body.get("distance_metric"), needed=vectors is not None)
        ns.upsert(ids, vectors, attrs)
        upserted += len(ids)
        written += len(ids) * (8 + (0 if vectors is None else 4 * vectors.shape[1])) + sum(
            value_bytes(v) for col in attrs.values() for v in col
        )
    if not batches and "distance_metric" in body:
        ns.set_metric(body["distance_metric"], needed=False)
    if "deletes" in body:
        if not isinstance(body["deletes"], list):
            raise ApiError(400, "deletes must be a list of ids")
        deleted += ns.delete([valid_id(i) for i in body["deletes"]])
    return upserted, deleted, written


def _batches(body: dict) -> list[tuple]:
    """(ids, vector column, {attribute: column}) for upsert_rows and upsert_columns."""
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
        batches.append((cols["id"], cols.get("vector"), {k: v for k, v in cols.items() if k not in ("id", "vector")}))
    return batches


def clone(server, name: str, source: str, empty_only: bool) -> dict:
    """branch_from_namespace (empty_only=False: an empty target may be replaced) or copy_from_namespace."""
    src = server.get(source)
    check_name(name)
    with server.lock:
        if name in server.namespaces and (empty_only or server.namespaces[name].n):
            raise ApiError(400 if empty_only else 409, f"namespace '{name}' already exists")
        with src.lock:
            dst = Namespace(name)
            for key in ("ids", "dim", "metric", "attrs", "types", "schema_extra", "attr_bytes"):
                setattr(dst, key, copy.deepcopy(getattr(src, key)))
            dst.slot_of = dict(src.slot_of)
            dst.vectors, dst.norms = src.vectors[: src.n].copy(), src.norms[: src.n].copy()
        server.namespaces[name] = dst
        server.born[name] = time.monotonic()
    return {
        "status": "OK",
        "message": "namespace copied",
        "rows_affected": dst.n,
        "billing": {"billable_logical_bytes_written": 0},
    }
