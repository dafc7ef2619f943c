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
    def __init__(self, table: str, dim: int, metric: Metric, attrs: Sequence[str]):
        self.table, self.dim, self.metric, self.attrs = table, dim, metric, list(attrs)


def table_name(name: str) -> str:
    """The table of a collection: its own name where PostgreSQL allows (63 bytes, not _-prefixed)."""
    if len(name.encode()) <= 63 and not name.startswith("_") and "\x00" not in name:
        return name
    return "c_" + hashlib.sha1(name.encode()).hexdigest()[:32]


def search_sql(
    s_index: int, table: sql.Composable, metric: Metric, single: bool, k: int | None, filters: Sequence[tuple[str, str]]
) -> sql.Composed:
    """The statement of one search: search number s_index, (op, attribute) filters taking %s parameters."""
    conditions = [sql.SQL("t.{} " + op + " %s").format(sql.Identifier(attr)) for op, attr in filters]
    cond = sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conditions) if conditions else sql.SQL("")
    q = sql.SQL("%b::vector") if single else sql.SQL("q.v")
    dist = sql.SQL(DISTANCE[metric]).format(sql.SQL("t.embedding"), q)
    fmt = dict(s=sql.Literal(s_index), table=table, dist=dist, cond=cond)
    if k is not None:
        fmt["k"] = sql.Literal(int(k))
    return sql.SQL(SEARCH[single, k is not None]).format(**fmt)


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
