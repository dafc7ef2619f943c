"""Searches of the pgvector store: every search of a search_many (each text's key searches among them) a
SELECT, all of them one UNION ALL statement a connection, a large weight table's scan split in page ranges over
the connections."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import psycopg

from vecgpt.backends import base
from vecgpt.backends.base import Hits, Search, Where, record
from vecgpt.backends.pgvector.arrays import numpy_arrays
from vecgpt.backends.pgvector.split import assign, block_ranges, merge
from vecgpt.backends.pgvector.statements import Meta, search_sql
from vecgpt.backends.pgvector.wide import split
from vecgpt.errors import VecgptError


class Searching:
    """Mixed into PgStore, which gives conn, _helpers, _sql, _commit, _col, _table, _run, _run_all and
    _connections."""

    # search
    def search(self, name: str, queries: np.ndarray, k: int | None = None, where: Where | None = None) -> Hits:
        return self.search_many([Search(name, queries, k, where)])[0]

    def search_many(self, searches: Sequence[Search]) -> list[Hits]:
        return self._run(self._search_many, list(searches))

    def _search_many(self, searches):
        self._commit()
        metas, prepared = [], []  # each search checked in turn: the first bad one is the error
        for s in searches:
            metas.append(self._col(s.collection))
            prepared.append(base.check_vectors(s.collection, s.queries, metas[-1].dim))
        # each search's vector dimension where it asks for its rows' vectors and gets them (never a wide collection's)
        dims = [m.dim if s.vectors and m.parts == 1 else None for s, m in zip(searches, metas)]
        radii = [base.check_radius(s, q.shape[:1]) for s, q in zip(searches, prepared)]
        pieces = []  # (search number, statement, parameters, cost)
        for s_index, (s, meta, queries, dim, radius) in enumerate(zip(searches, metas, prepared, dims, radii)):
            if len(queries) == 0 or s.k == 0:
                continue
            ranges = self._ranges(meta, s)
            for blocks in ranges:
                text, args = self._search_sql(
                    len(pieces), meta, queries, s.k, s.where, s.collection, blocks, dim is not None, radius
                )
                pieces.append((s_index, text, args, len(queries) * max(meta.pages, 1) / len(ranges)))
        found = self._send(pieces, sum(len(q) for q in prepared)) if pieces else {}
        mine = [[] for _ in searches]  # each search's pieces
        for p, piece in enumerate(pieces):
            mine[piece[0]].append(p)
        out = []
        for s, meta, queries, at, dim, radius in zip(searches, metas, prepared, mine, dims, radii):
            per_query = [
                merge([arrays(found.get((p, i))) for p in at], s.k, meta.parts) for i in range(1, len(queries) + 1)
            ]
            out.append(
                hits(s.collection, len(queries), per_query, dim) if radius is None else within(per_query, s, radius)
            )
        return out

    def _ranges(self, meta: Meta, s: Search) -> list:
        """The page ranges a search is split into: [None] (whole) unless a large weight table."""
        n = len(self._helpers) + 1
        whole = base.is_text(s.collection) or (s.k is not None and meta.parts > 1)  # keys; wide top-k
        return [None] if n == 1 or whole or meta.pages < self.split_pages else block_ranges(meta.pages, n)

    def _send(self, pieces: list, subqueries: int) -> dict:
        """The pieces as one UNION ALL statement per connection, sent at once: {(piece, query number): (ids, dists)}."""
        costs = [p[3] for p in pieces]
        n = min(len(self._helpers) + 1, len(pieces)) if sum(costs) >= self.share_pages else 1  # small: one is enough
        connections = self._connections(n)
        on = assign(costs, len(connections))
        jobs = []
        for c, conn in enumerate(connections):
            texts = [p[1] for p, at in zip(pieces, on) if at == c]
            query = " UNION ALL ".join(f"({t})" for t in texts) if len(texts) > 1 else texts[0]
            jobs.append((conn, fetch_rows, (query, [a for p, at in zip(pieces, on) if at == c for a in p[2]])))
        record(len(jobs), subqueries)
        return {key: found for rows in self._run_all(jobs) for row in rows for key, found in per_query(*row)}

    def _search_sql(self, s_index, meta, queries, k, where, name, blocks=None, vectors=False, radius=None):
        """One SELECT giving (search, query number, ids[], dists[], vectors[][] or NULL) rows for one search
        (blocks: the rows in that page range; vectors: the rows' vectors too; radius: only the rows within each
        query's, but for a wide collection, whose distances are summed here): its text, params."""
        filters = []
        if where is not None:
            base.check_where(name, where, meta.attrs)
            filters = [
                (op, attr, int(value))
                for op, values in (("=", where.eq), ("<", where.lt), (">=", where.ge))
                for attr, value in sorted(values.items())
            ]
        ranged = radius is not None and meta.parts == 1
        single = len(queries) == 1 and not ranged
        m = len(queries) if k is None and radius is None else 1  # several queries, every row: one scan (m > 1)
        key = (s_index, name, single, k, tuple(f[:2] for f in filters), blocks, vectors, ranged, m)
        text = self._sql.get(key)
        if text is None:  # composing costs more than the statement on small tables: once per shape
            text = self._sql[key] = search_sql(
                s_index,
                self._table(meta),
                meta.metric,
                single,
                k,
                [f[:2] for f in filters],
                meta.parts,
                blocks,
                vectors,
                ranged,
                m,
            ).as_string(self.conn)
        return text, query_params(queries, meta.parts, single, m, radius if ranged else None) + [f[2] for f in filters]


def query_params(queries: np.ndarray, parts: int, single: bool, m: int, radius) -> list:
    """A search statement's parameters before its filters': the query vector(s), part by part, then the radii."""
    if m > 1:  # a vector per query, part by part
        return [*split(queries, parts).reshape(m, parts, -1).transpose(1, 0, 2).reshape(m * parts, -1)]
    if parts > 1:  # a vector (single) or an array of vectors per part
        split_queries = split(queries, parts).reshape(len(queries), parts, -1)
        return [split_queries[0, p] if single else list(split_queries[:, p]) for p in range(parts)]
    if radius is not None:
        return [list(queries), radius.tolist()]
    return [queries[0] if single else list(queries)]


def per_query(p: int, i: int, ids, dists, vectors) -> list[tuple]:
    """A result row as ((piece, query number), (ids, dists, vectors)) for each of its queries: query number 0 is
    a scan for every query, its distances one column a query."""
    if i:
        return [((p, i), (ids, dists, vectors))]
    if ids is None:  # no row matched: array_agg gave NULL (arrays() reads a missing query as none)
        return []
    return [((p, j + 1), (ids, np.ascontiguousarray(d), vectors)) for j, d in enumerate(dists.T)]


def arrays(found: tuple | None) -> tuple:
    """A query's (ids, dists, vectors or None), empty where it matched no row (array_agg over no rows is NULL)."""
    if found is None or found[0] is None:
        return np.zeros(0, np.int64), np.zeros(0), None
    return found


def hits(name: str, m: int, found: list[tuple], dim: int | None = None) -> Hits:
    """m queries' (ids, dists, vectors) as Hits (dim: with the rows' vectors, that wide); every query sees the
    same rows."""
    n = len(found[0][0]) if found else 0
    if any(len(f[0]) != n for f in found):
        raise VecgptError(f"search in {name!r}: queries got different numbers of rows")
    if n == 0:
        return base.no_hits(m, dim)
    if m == 1:
        ids, dists, vectors = found[0]
        return Hits(ids[None], dists[None], None if dim is None else vectors[None])
    ids, dists = np.vstack([f[0] for f in found]), np.vstack([f[1] for f in found])
    return Hits(ids, dists, None if dim is None else np.stack([f[2] for f in found]))


def within(found: list[tuple], s: Search, radius) -> Hits:
    """A radius search's ragged Hits from each query's rows: those within its radius (already so, but for a wide
    collection's, whose distances are summed here), at most k."""
    rows = [(ids[dists <= r], dists[dists <= r]) for (ids, dists, _), r in zip(found, radius.tolist())]
    return base.ragged(rows, s.k)


def fetch_rows(conn: psycopg.Connection, query: str, params: list) -> list:
    """A search statement's rows (search, query number, ids[], dists[], vectors or NULL), the arrays read into
    numpy."""
    return numpy_arrays(conn.cursor(binary=True)).execute(query, params).fetchall()
