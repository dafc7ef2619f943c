"""The SQL a collection needs: its table's name, the search statements, and the binary COPY stream."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
from psycopg import sql

from vecgpt.backends.base import Metric

DISTANCE = {"l2": "vector_l2_squared_distance({}, {})", "ip": "({} <#> {})"}
COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + b"\x00" * 8
COPY_TRAILER = b"\xff\xff"
# A search gives rows (search number, query number, ids[], dists[]); one query vector is a parameter,
# several are unnested; every row is one array_agg, the k nearest an ORDER BY ... LIMIT per query.
SEARCH = {
    (True, False): "SELECT {s}::int, 1::bigint, array_agg(t.id), array_agg({dist}) FROM {table} t{cond}",
    (False, False): "SELECT {s}::int, q.i, array_agg(t.id), array_agg({dist}) FROM {table} t "
    "CROSS JOIN unnest(%b::vector[]) WITH ORDINALITY q(v, i){cond} GROUP BY q.i",
    (True, True): "SELECT {s}::int, 1::bigint, array_agg(x.id ORDER BY x.d, x.id), array_agg(x.d ORDER BY x.d, x.id) "
    "FROM (SELECT t.id, {dist} AS d FROM {table} t{cond} ORDER BY d, t.id LIMIT {k}) x",
    (False, True): "SELECT {s}::int, q.i, array_agg(x.id ORDER BY x.d, x.id), array_agg(x.d ORDER BY x.d, x.id) "
    "FROM unnest(%b::vector[]) WITH ORDINALITY q(v, i) CROSS JOIN LATERAL "
    "(SELECT t.id, {dist} AS d FROM {table} t{cond} ORDER BY d, t.id LIMIT {k}) x GROUP BY q.i",
}


class Meta:
    def __init__(self, table: str, dim: int, metric: Metric, attrs: Sequence[str], parts: int = 1):
        self.table, self.dim, self.metric, self.attrs = table, dim, metric, list(attrs)
        self.parts = parts  # rows a document: 1, or more for a wide one (vecgpt/backends/pgvector/wide.py)


def table_name(name: str) -> str:
    """The table of a collection: its own name where PostgreSQL allows (63 bytes, not _-prefixed)."""
    if len(name.encode()) <= 63 and not name.startswith("_") and "\x00" not in name:
        return name
    return "c_" + hashlib.sha1(name.encode()).hexdigest()[:32]


def search_sql(
    s_index: int,
    table: sql.Composable,
    metric: Metric,
    single: bool,
    k: int | None,
    filters: Sequence[tuple[str, str]],
    parts: int = 1,
) -> sql.Composed:
    """The statement of one search: search number s_index, (op, attribute) filters taking %s parameters;
    the query vector(s) first: one per part (single), or one array per part."""
    conditions = [sql.SQL("t.{} " + op + " %s").format(sql.Identifier(attr)) for op, attr in filters]
    cond = sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conditions) if conditions else sql.SQL("")
    fmt = dict(s=sql.Literal(s_index), table=table, cond=cond)
    if k is not None:
        fmt["k"] = sql.Literal(int(k))
    if parts > 1:
        return wide_sql(metric, single, k, parts, fmt)
    q = sql.SQL("%b::vector") if single else sql.SQL("q.v")
    return sql.SQL(SEARCH[single, k is not None]).format(
        dist=sql.SQL(DISTANCE[metric]).format(sql.SQL("t.embedding"), q), **fmt
    )


# A wide collection's search: the same shapes, a document's distance the sum over its part rows.
WIDE = {
    (True, False): "SELECT {s}::int, 1::bigint, array_agg(x.id), array_agg(x.d) FROM "
    "(SELECT t.id / {p} AS id, sum({dist}) AS d FROM {table} t{cond} GROUP BY 1) x",
    (False, False): "SELECT {s}::int, x.i, array_agg(x.id), array_agg(x.d) FROM "
    "(SELECT q.i, t.id / {p} AS id, sum({dist}) AS d FROM {table} t CROSS JOIN {unnest}{cond} GROUP BY 1, 2) x "
    "GROUP BY x.i",
    (True, True): "SELECT {s}::int, 1::bigint, array_agg(x.id ORDER BY x.d, x.id), array_agg(x.d ORDER BY x.d, x.id) "
    "FROM (SELECT t.id / {p} AS id, sum({dist}) AS d FROM {table} t{cond} GROUP BY 1 ORDER BY 2, 1 LIMIT {k}) x",
    (False, True): "SELECT {s}::int, q.i, array_agg(x.id ORDER BY x.d, x.id), array_agg(x.d ORDER BY x.d, x.id) "
    "FROM {unnest} CROSS JOIN LATERAL (SELECT t.id / {p} AS id, sum({dist}) AS d FROM {table} t{cond} "
    "GROUP BY 1 ORDER BY 2, 1 LIMIT {k}) x GROUP BY q.i",
}


def wide_sql(metric: Metric, single: bool, k: int | None, parts: int, fmt: dict) -> sql.Composed:
    queries = [sql.SQL("%b::vector")] * parts if single else [sql.SQL(f"q.v{p}") for p in range(parts)]
    cases = [
        sql.SQL("WHEN {} THEN ").format(sql.Literal(p)) + sql.SQL(DISTANCE[metric]).format(sql.SQL("t.embedding"), q)
        for p, q in enumerate(queries)
    ]
    dist = sql.SQL("CASE t.id %% {} ").format(sql.Literal(parts)) + sql.SQL(" ").join(cases) + sql.SQL(" END")
    names = ", ".join(f"v{p}" for p in range(parts))
    unnest = sql.SQL(f"unnest({', '.join(['%b::vector[]'] * parts)}) WITH ORDINALITY q({names}, i)")
    return sql.SQL(WIDE[single, k is not None]).format(dist=dist, p=sql.Literal(parts), unnest=unnest, **fmt)


def copy_stream(ids: np.ndarray, attrs: list[np.ndarray], vectors: np.ndarray) -> bytes:
    """PostgreSQL's binary COPY format for rows (id, attrs..., vector), all big-endian."""
    n, dim = vectors.shape
    fields = [("count", ">i2")]
    for i in range(1 + len(attrs)):
        fields += [(f"len{i}", ">i4"), (f"int{i}", ">i8")]
    fields += [("vlen", ">i4"), ("dim", ">i2"), ("unused", ">i2"), ("vec", ">f4", (dim,))]
    rows = np.zeros(n, np.dtype(fields))
    rows["count"] = 2 + len(attrs)
    for i, column in enumerate([ids, *attrs]):
        rows[f"len{i}"], rows[f"int{i}"] = 8, column
    rows["vlen"], rows["dim"], rows["vec"] = 4 + 4 * dim, dim, vectors
    return COPY_HEADER + rows.tobytes() + COPY_TRAILER
