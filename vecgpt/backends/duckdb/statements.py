"""SQL for the DuckDB store: a collection's table and columns, filters, and the search statement."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from vecgpt.backends.base import Metric, Where

RESERVED = {"id", "v", "payload", "i", "g"}  # a collection table's own columns, and the query table's
# DuckDB's own distance functions over FLOAT[n]: negated inner product, and the L2 distance (not squared: its
# square is taken in float64 here, exact for a float32).
DISTANCE = {"ip": "array_negative_inner_product(w.v, q.v)", "l2": "array_distance(w.v, q.v)"}
OPS = {np.equal: "=", np.less: "<", np.greater_equal: ">="}
# A radius search's condition: the distance as the store gives it, in DOUBLE (l2: the root squared, as hits() does).
WITHIN = {
    "ip": f"CAST({DISTANCE['ip']} AS DOUBLE) <= q.r",
    "l2": f"CAST({DISTANCE['l2']} AS DOUBLE) * CAST({DISTANCE['l2']} AS DOUBLE) <= q.r",
}


@dataclass
class Meta:
    """A collection as the catalog (vecgpt_collections) describes it."""

    table: str
    dim: int
    metric: Metric
    attrs: list[str]
    payload: int

    def columns(self) -> str:
        """The table's columns: id, the attributes, the vector and (a width) the payload."""
        parts = ["id BIGINT", *(f"{quote(a)} BIGINT" for a in self.attrs), f"v FLOAT[{self.dim}]"]
        return ", ".join(parts + ([f"payload FLOAT[{self.payload}]"] if self.payload else []))

    def schema(self) -> pa.Schema:
        fields = [pa.field("id", pa.int64()), *(pa.field(a, pa.int64()) for a in self.attrs)]
        fields.append(pa.field("v", pa.list_(pa.float32(), self.dim)))
        return pa.schema(fields + ([pa.field("payload", pa.list_(pa.float32(), self.payload))] if self.payload else []))


def table_name(name: str) -> str:
    """A collection's table: its name made an identifier, with a digest of the exact name (DuckDB matches
    identifiers without regard to case, so "A" and "a" need tables of their own)."""
    slug = re.sub(r"[^a-z0-9_]", "_", name.lower())[:40]
    return f"c_{slug}_{hashlib.sha1(name.encode()).hexdigest()[:12]}"


def quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def terms(where: Where | None) -> list[str]:
    """A filter as SQL terms on the table `w` (integers only: written into the statement)."""
    if where is None:
        return []
    return sorted(f"w.{quote(name)} {OPS[op]} {int(value)}" for op, name, value in where.conditions())


def search_sql(
    meta: Meta,
    queries: str,
    m: int,
    k: int | None,
    where: Where | None,
    by: str | None,
    vectors: bool,
    radius: bool = False,
) -> str:
    """One statement scoring the m queries of the table `queries` (columns i, v; g for a grouped search; r, a radius
    search's radii) against the rows of a collection that match: rows (g,) i, id, d (the store's distance) and
    (vectors) the rows' v as rv. With k (not grouped): each query's k nearest (ties by id), ordered by query, then
    distance, then id, as one top-k per query (DuckDB's top-N; a window over every query's rows sorts them all, 20x
    slower). With radius: only the rows whose distance, as the store gives it (l2: squared in float64), is <= r."""
    rows = [
        *(["q.g"] if by else []),
        "q.i",
        "w.id",
        f"{DISTANCE[meta.metric]} AS d",
        *(["w.v AS rv"] if vectors else []),
    ]
    conditions = terms(where) + ([WITHIN[meta.metric]] if radius else [])
    filtered = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    table = quote(meta.table)
    if k is None:
        joined = f"{table} w JOIN {queries} q ON w.{quote(by)} = q.g" if by else f"{table} w, {queries} q"
        return f"SELECT {', '.join(rows)} FROM {joined}{filtered}"
    taken = "i, v, r" if radius else "i, v"
    one = f"SELECT {', '.join(rows)} FROM {table} w, (SELECT {taken} FROM {queries} WHERE i = {{}}) q{filtered}"
    parts = [f"({one.format(i)} ORDER BY d, w.id LIMIT {int(k)})" for i in range(m)]
    return " UNION ALL ".join(parts) + " ORDER BY i, d, id"


def fixed(values: np.ndarray) -> pa.FixedSizeListArray:
    """float32 [n, width] as an Arrow FixedSizeList column (DuckDB reads it as FLOAT[width])."""
    values = np.ascontiguousarray(values, np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), values.shape[1])


def floats(column, width: int) -> np.ndarray:
    """A FLOAT[width] column of a result as float32 [n, width]."""
    if len(column) == 0:
        return np.zeros((0, width), np.float32)
    return column.combine_chunks().flatten().to_numpy().reshape(-1, width)


def query_table(queries: np.ndarray, radius: np.ndarray | None = None) -> pa.Table:
    """Queries [m, dim] (or [G, m, dim]: groups) as the Arrow table a search statement reads: i, (g,) v, and a radius
    search's radii (of the queries' shape) as r."""
    radii = {} if radius is None else {"r": np.asarray(radius, np.float64).ravel()}
    if queries.ndim == 3:
        groups, m, dim = queries.shape
        g, i = np.divmod(np.arange(groups * m, dtype=np.int64), m)
        return pa.table({"g": g, "i": i, "v": fixed(queries.reshape(groups * m, dim)), **radii})
    return pa.table({"i": np.arange(len(queries), dtype=np.int64), "v": fixed(queries), **radii})
