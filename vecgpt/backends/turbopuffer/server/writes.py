"""POST /v2/namespaces/{ns}: upsert_rows, upsert_columns, patch_rows, patch_columns, deletes,
delete_by_filter, the conditions upsert_condition / patch_condition / delete_condition (with `$ref_new`),
distance_metric, schema; branch_from_namespace and copy_from_namespace (string or object form).

Conditions as the service documents them (docs write page, "Conditional writes"): evaluated before each write
against the document's current value; an upsert to an id that does not exist is applied unconditionally, a
patch to one is ignored without evaluating the condition, and in a delete_condition every `$ref_new` is null."""

from __future__ import annotations

import copy
import time

import numpy as np

from vecgpt.backends.turbopuffer.server.limits import ApiError, check_name, check_sizes, valid_id, value_bytes
from vecgpt.backends.turbopuffer.server.namespaces import Namespace, decode_vectors

FIELDS = {
    "upsert_rows",
    "upsert_columns",
    "patch_rows",
    "patch_columns",
    "deletes",
    "upsert_condition",
    "patch_condition",
    "delete_condition",
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
        done, written = _apply(ns, body)
        ns.note_write(done["upserted"] + done["patched"], server.index_lag)
    affected = sum(done.values())
    return {
        "status": "OK",
        "message": f"{affected} rows affected",
        "rows_affected": affected,
        **{f"rows_{kind}": n for kind, n in done.items() if kind != "patched" or _has(body, "patch")},
        "billing": {"billable_logical_bytes_written": written},
        "performance": {"server_total_ms": round(1000 * (time.perf_counter() - start), 3)},
    }


def _has(body: dict, kind: str) -> bool:
    return f"{kind}_rows" in body or f"{kind}_columns" in body


def _apply(ns: Namespace, body: dict) -> tuple[dict, int]:
    """({"upserted", "patched", "deleted": rows}, bytes written), in the service's order: schema,
    delete_by_filter, upserts, patches, deletes; each conditional write checked against the rows as they
    were before the request."""
    done, written = {"upserted": 0, "patched": 0, "deleted": 0}, 0
    if "schema" in body:
        if not isinstance(body["schema"], dict):
            raise ApiError(400, "schema must be an object")
        ns.schema_extra.update(body["schema"])
    if "delete_by_filter" in body:
        gone = [ns.ids[s] for s in np.flatnonzero(ns.mask(body["delete_by_filter"]))]
        done["deleted"] += ns.delete(gone)
    upserts, patches = _batches(body, "upsert"), _batches(body, "patch")
    for _, _, attrs in upserts + patches:
        check_sizes(ns, attrs)
    for ids, vecs, attrs in upserts:
        vectors = decode_vectors(vecs)
        ns.set_metric(body.get("distance_metric"), needed=vectors is not None)
        ids, vectors, attrs = _passing(ns, body.get("upsert_condition"), ids, vectors, attrs, absent=True)
        ns.upsert(ids, vectors, attrs)
        done["upserted"] += len(ids)
        written += len(ids) * (8 + (0 if vectors is None else 4 * vectors.shape[1])) + _bytes(attrs)
    if not upserts and "distance_metric" in body:
        ns.set_metric(body["distance_metric"], needed=False)
    for ids, vecs, attrs in patches:
        if vecs is not None:
            raise ApiError(400, "vector attributes cannot be patched; upsert the whole document")
        ids, _, attrs = _passing(ns, body.get("patch_condition"), ids, None, attrs, absent=False)
        done["patched"] += ns.patch(ids, attrs)
        written += _bytes(attrs)
    if "deletes" in body:
        if not isinstance(body["deletes"], list):
            raise ApiError(400, "deletes must be a list of ids")
        ids = [valid_id(i) for i in body["deletes"]]
        ids, _, _ = _passing(ns, body.get("delete_condition"), ids, None, {}, absent=False)
        done["deleted"] += ns.delete(ids)
    return done, written


def _bytes(attrs: dict) -> int:
    return sum(value_bytes(v) for col in attrs.values() for v in col)


def _passing(ns: Namespace, condition, ids: list, vectors, attrs: dict, absent: bool):
    """The rows of a write whose document meets the condition (`$ref_new` bound to the row written);
    an id not held goes ahead if `absent`."""
    if condition is None:
        return ids, vectors, attrs
    keep = []
    for r, i in enumerate(ids):
        slot = ns.slot_of.get(i)
        if slot is None:
            keep.append(absent)
            continue
        new = {"id": i, **{a: col[r] for a, col in attrs.items()}}
        keep.append(bool(ns.mask(_bind(condition, new))[slot]))
    rows = [r for r, k in enumerate(keep) if k]
    return (
        [ids[r] for r in rows],
        None if vectors is None else vectors[rows],
        {a: [col[r] for r in rows] for a, col in attrs.items()},
    )


def _bind(condition, new: dict):
    """The condition with every {"$ref_new": attr} replaced by that attribute of the row written (null if absent)."""
    if isinstance(condition, dict) and set(condition) == {"$ref_new"}:
        return new.get(condition["$ref_new"])
    if isinstance(condition, list):
        return [_bind(c, new) for c in condition]
    return condition


def _batches(body: dict, kind: str) -> list[tuple]:
    """(ids, vector column, {attribute: column}) for <kind>_rows and <kind>_columns (kind: upsert, patch)."""
    batches = []
    if f"{kind}_rows" in body:
        rows = body[f"{kind}_rows"]
        if not isinstance(rows, list) or any(not isinstance(r, dict) or "id" not in r for r in rows):
            raise ApiError(400, f"{kind}_rows must be a list of objects, each with an id")
        names = sorted({k for r in rows for k in r} - {"id", "vector"})
        vecs = [r.get("vector") for r in rows]
        vecs = None if kind == "patch" and all(v is None for v in vecs) else vecs
        batches.append(([r["id"] for r in rows], vecs, {k: [r.get(k) for r in rows] for k in names}))
    if f"{kind}_columns" in body:
        cols = body[f"{kind}_columns"]
        if not isinstance(cols, dict) or "id" not in cols:
            raise ApiError(400, f"{kind}_columns must be an object of columns, with an id column")
        lengths = {len(v) for v in cols.values() if isinstance(v, list)}
        if len(lengths) != 1 or any(not isinstance(v, list) for v in cols.values()):
            raise ApiError(400, f"{kind}_columns: every column must be an array of the same length")
        batches.append((cols["id"], cols.get("vector"), {k: v for k, v in cols.items() if k not in ("id", "vector")}))
    for ids, _, _ in batches:
        if len(set(valid_id(i) for i in ids)) != len(ids):
            raise ApiError(400, f"{kind}: the same document id appears more than once in the request")
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
            dst.rows = None if src.rows is None else src.rows.copy(src.n)
        server.namespaces[name] = dst
        server.born[name] = time.monotonic()
    return {
        "status": "OK",
        "message": "namespace copied",
        "rows_affected": dst.n,
        "billing": {"billable_logical_bytes_written": dst.logical_bytes() if empty_only else 0},  # a branch: flat fee
    }
