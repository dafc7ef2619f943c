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
# A search gives rows (search number, query number, ids[], dists[], vectors[][] or NULL); one query vector is a
# parameter, several are unnested; every row is one array_agg, the k nearest an ORDER BY ... LIMIT per query.
# Every row for several queries is one scan: each row's distance to every query (a parameter each) as one ARRAY,
# aggregated to float8[n][m] under query number 0. A CROSS JOIN of the rows with the unnested queries grouped by
# query spent four fifths of its time in the grouping (c_fc, 16 queries: 52 ms against 11).
# {vec}: the rows' vectors, where the search asks for them (Search.vectors), as real[] rows of one array.
SEARCH = {
    (True, False): "SELECT {s}::int, 1::bigint, array_agg(t.id), array_agg({dist}){vec} FROM {table} t{cond}",
    (False, False): "SELECT {s}::int, q.i, array_agg(t.id), array_agg({dist}){vec} FROM {table} t "
    "CROSS JOIN unnest(%b::vector[]) WITH ORDINALITY q(v, i){cond} GROUP BY q.i",
    "every": "SELECT {s}::int, 0::bigint, array_agg(t.id), array_agg(ARRAY[{dists}]){vec} FROM {table} t{cond}",
    (True, True): "SELECT {s}::int, 1::bigint, array_agg(x.id ORDER BY x.d, x.id), array_agg(x.d ORDER BY x.d, x.id)"
    "{vec} FROM (SELECT t.id, {dist} AS d FROM {table} t{cond} ORDER BY d, t.id LIMIT {k}) x",
    (False, True): "SELECT {s}::int, q.i, array_agg(x.id ORDER BY x.d, x.id), array_agg(x.d ORDER BY x.d, x.id){vec} "
    "FROM unnest(%b::vector[]) WITH ORDINALITY q(v, i) CROSS JOIN LATERAL "
    "(SELECT t.id, {dist} AS d FROM {table} t{cond} ORDER BY d, t.id LIMIT {k}) x GROUP BY q.i",
}
RADII = "unnest(%b::vector[], %b::float8[]) WITH ORDINALITY q(v, r, i)"  # a radius search's queries and radii
NO_VECTORS = ", NULL::real[]"  # a UNION ALL's statements all have the fifth column
# The k nearest's vectors are looked up by id once they are chosen: read with every row scanned, each row's vector
# would go through the sort.
VECTORS = {
    False: ", array_agg(t.embedding::real[])",
    True: ", array_agg((SELECT v.embedding::real[] FROM {table} v WHERE v.id = x.id) ORDER BY x.d, x.id)",
}  # by whether k is given


class Meta:
    def __init__(self, table: str, dim: int, metric: Metric, attrs: Sequence[str], payload: int = 0, parts: int = 1):
        self.table, self.dim, self.metric, self.attrs, self.payload = table, dim, metric, list(attrs), payload
        self.parts = parts  # rows a document: 1, or more for a wide one (vecgpt/backends/pgvector/wide.py)
        self.pages = 0  # the table's size when its catalog row was read: a search splits by it (split.py)

    def vector_columns(self) -> list[str]:
        """The vector(n) columns: the embedding, and the payload where the collection has one."""
        return ["embedding", "payload"] if self.payload else ["embedding"]


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
    blocks: tuple[int, int | None] | None = None,
    vectors: bool = False,
    radius: bool = False,
    m: int = 1,
) -> sql.Composed:
    """The statement of one search: search number s_index, (op, attribute) filters taking %s parameters,
    (blocks) only the rows in pages [lo, hi), (vectors) the rows' vectors too, but never a wide collection's
    (parts > 1: its fifth column is NULL); the query vector(s) first: one per part (single), or one array per
    part. With radius (several queries, one part): the rows at distance <= each query's radius, an array of
    float8 radii the parameter after the queries'. m > 1 (several queries, every row, no radius): each query a
    parameter (part by part), one scan."""
    conditions = [sql.SQL("t.{} " + op + " %s").format(sql.Identifier(attr)) for op, attr in filters]
    if radius:
        conditions.append(sql.SQL(DISTANCE[metric] + " <= q.r").format(sql.SQL("t.embedding"), sql.SQL("q.v")))
    conditions += block_conditions(blocks)
    cond = sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conditions) if conditions else sql.SQL("")
    fmt = dict(s=sql.Literal(s_index), table=table, cond=cond, vec=sql.SQL(NO_VECTORS))
    if vectors and parts == 1:
        fmt["vec"] = sql.SQL(VECTORS[k is not None]).format(table=table)
    if k is not None:
        fmt["k"] = sql.Literal(int(k))
    if parts > 1:
        return wide_sql(metric, single, k, parts, fmt, m)
    if m > 1:
        return sql.SQL(SEARCH["every"]).format(dists=every(metric, [sql.SQL("%b::vector")] * m), **fmt)
    q = sql.SQL("%b::vector") if single else sql.SQL("q.v")
    template = SEARCH[single, k is not None]
    if radius:
        template = template.replace("unnest(%b::vector[]) WITH ORDINALITY q(v, i)", RADII)
    return sql.SQL(template).format(dist=sql.SQL(DISTANCE[metric]).format(sql.SQL("t.embedding"), q), **fmt)


def every(metric: Metric, queries: Sequence[sql.Composable]) -> sql.Composed:
    """The distances of row t to each query, comma-separated."""
    return sql.SQL(", ").join(sql.SQL(DISTANCE[metric]).format(sql.SQL("t.embedding"), q) for q in queries)


def block_conditions(blocks: tuple[int, int | None] | None) -> list[sql.Composed]:
    """Rows whose ctid is in pages [lo, hi) (hi None: to the end), which PostgreSQL scans as a TID range."""
    if blocks is None:
        return []
    lo, hi = blocks
    bounds = ([(">=", lo)] if lo else []) + ([("<", hi)] if hi is not None else [])
    return [sql.SQL("t.ctid " + op + " {}::tid").format(sql.Literal(f"({page},0)")) for op, page in bounds]


# A wide collection's search: the same shapes, a document's distance the sum over its part rows. Every row
# is wanted: each part row's distance comes back under its document's id, and split.merge adds them up
# (cheaper than a GROUP BY in PostgreSQL). The k nearest: the part rows' distances are computed below an
# OFFSET 0 fence, so the grouping sorts or hashes (id, distance) pairs: without it the planner sorts the rows,
# vectors and all, and spills them to disk.
ROWS = "(SELECT t.id / {p} AS id, {dist} AS d FROM {table} t{cond} OFFSET 0) y"
WIDE = {
    (True, False): "SELECT {s}::int, 1::bigint, array_agg(t.id / {p}), array_agg({dist}){vec} FROM {table} t{cond}",
    (False, False): "SELECT {s}::int, q.i, array_agg(t.id / {p}), array_agg({dist}){vec} FROM {table} t "
    "CROSS JOIN {unnest}{cond} GROUP BY q.i",
    "every": "SELECT {s}::int, 0::bigint, array_agg(t.id / {p}), array_agg({dist}){vec} FROM {table} t{cond}",
    (True, True): "SELECT {s}::int, 1::bigint, array_agg(x.id ORDER BY x.d, x.id), array_agg(x.d ORDER BY x.d, x.id)"
    "{vec} FROM (SELECT y.id, sum(y.d) AS d FROM " + ROWS + " GROUP BY 1 ORDER BY 2, 1 LIMIT {k}) x",
    (False, True): "SELECT {s}::int, q.i, array_agg(x.id ORDER BY x.d, x.id), array_agg(x.d ORDER BY x.d, x.id){vec} "
    "FROM {unnest} CROSS JOIN LATERAL (SELECT y.id, sum(y.d) AS d FROM " + ROWS + " "
    "GROUP BY 1 ORDER BY 2, 1 LIMIT {k}) x GROUP BY q.i",
}


def wide_sql(metric: Metric, single: bool, k: int | None, parts: int, fmt: dict, m: int = 1) -> sql.Composed:
    """m > 1: every row's distances to m queries, an ARRAY of them for the part the row holds (parameters: the m
    queries' first parts, then their second parts ...)."""
    if m > 1:
        param = [sql.SQL("%b::vector")] * m
        cases = [
            sql.SQL("WHEN {} THEN ARRAY[").format(sql.Literal(p)) + every(metric, param) + sql.SQL("]")
            for p in range(parts)
        ]
    else:
        queries = [sql.SQL("%b::vector")] * parts if single else [sql.SQL(f"q.v{p}") for p in range(parts)]
        cases = [
            sql.SQL("WHEN {} THEN ").format(sql.Literal(p))
            + sql.SQL(DISTANCE[metric]).format(sql.SQL("t.embedding"), q)
            for p, q in enumerate(queries)
        ]
    dist = sql.SQL("CASE t.id %% {} ").format(sql.Literal(parts)) + sql.SQL(" ").join(cases) + sql.SQL(" END")
    names = ", ".join(f"v{p}" for p in range(parts))
    unnest = sql.SQL(f"unnest({', '.join(['%b::vector[]'] * parts)}) WITH ORDINALITY q({names}, i)")
    template = WIDE["every"] if m > 1 else WIDE[single, k is not None]
    return sql.SQL(template).format(dist=dist, p=sql.Literal(parts), unnest=unnest, **fmt)


def row_dtype(ints: int, dims: Sequence[int]) -> np.dtype:
    """One row of a binary COPY (either way): a field count, then `ints` bigints and a pgvector per dim."""
    fields = [("count", ">i2")]
    for i in range(ints):
        fields += [(f"len{i}", ">i4"), (f"int{i}", ">i8")]
    for j, dim in enumerate(dims):
        fields += [(f"vlen{j}", ">i4"), (f"dim{j}", ">i2"), (f"unused{j}", ">i2"), (f"vec{j}", ">f4", (dim,))]
    return np.dtype(fields)


def copy_stream(ids: np.ndarray, attrs: list[np.ndarray], vectors: Sequence[np.ndarray]) -> bytes:
    """PostgreSQL's binary COPY format for rows (id, attrs..., vectors...), all big-endian."""
    ints = [ids, *attrs]
    rows = np.zeros(len(ids), row_dtype(len(ints), [v.shape[1] for v in vectors]))
    rows["count"] = len(ints) + len(vectors)
    for i, column in enumerate(ints):
        rows[f"len{i}"], rows[f"int{i}"] = 8, column
    for j, block in enumerate(vectors):
        dim = block.shape[1]
        rows[f"vlen{j}"], rows[f"dim{j}"], rows[f"vec{j}"] = 4 + 4 * dim, dim, block
    return COPY_HEADER + rows.tobytes() + COPY_TRAILER


def read_copy(data: bytes, dims: Sequence[int]) -> np.ndarray:
    """The rows (id, vectors...) of a binary COPY TO STDOUT: every field has a fixed width, so one frombuffer."""
    if not data.startswith(COPY_HEADER[:11]) or not data.endswith(COPY_TRAILER):
        raise ValueError("not a binary COPY stream")
    row = row_dtype(1, dims)
    body = len(data) - len(COPY_HEADER) - len(COPY_TRAILER)
    return np.frombuffer(data, row, offset=len(COPY_HEADER), count=body // row.itemsize)


def fetch_copy(table: sql.Composable, columns: Sequence[str], ids: np.ndarray) -> sql.Composed:
    """COPY out the rows of these ids (a literal: COPY takes no parameters), in any order."""
    listed = "{" + ",".join(map(str, ids.tolist())) + "}"
    return sql.SQL("COPY (SELECT id, {} FROM {} WHERE id = ANY({}::bigint[])) TO STDOUT (FORMAT BINARY)").format(
        sql.SQL(", ").join(map(sql.Identifier, columns)), table, sql.Literal(listed)
    )
