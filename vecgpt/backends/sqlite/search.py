"""search and search_many of the SQLite store: every query vector is one KNN per piece, the KNNs of a search_many
(every text's key searches of a step among them) joined by UNION ALL into one statement a thread, run on the
threads' own connections at once; a model's large scan is split by id range over the threads, and a search that
wants more rows than sqlite-vec's k is split into ranges of at most k ids (knn.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vecgpt.backends import base
from vecgpt.backends.base import Hits, Search, Where, record
from vecgpt.backends.sqlite import knn
from vecgpt.backends.sqlite.db import quoted
from vecgpt.backends.sqlite.knn import LIMIT, Found, Table
from vecgpt.errors import VecgptError

LOWEST, HIGHEST = -(2**63), 2**63 - 1  # open ends of a range: every id
ARMS = 256  # KNNs a statement joins by UNION ALL at most (SQLite's limit: 500)
SPLIT_WORK = 1 << 19  # rows x dim of a model's table from which a scan is split over the threads


class Piece:
    """One KNN: query qi of search si, the rows with ids in [lo, hi) (None: every row), k of them."""

    __slots__ = ("si", "qi", "span", "k", "found")

    def __init__(self, si: int, qi: int, span: tuple[int, int] | None, k: int):
        self.si, self.qi, self.span, self.k = si, qi, span, k
        self.found: Found | None = None


class Searching:
    """Mixed into SqliteStore, which gives db, threads, _table and limit."""

    limit = LIMIT  # sqlite-vec's largest k (a test makes it smaller)

    def search(self, name: str, queries: np.ndarray, k: int | None = None, where: Where | None = None) -> Hits:
        return self.search_many([Search(name, queries, k, where)])[0]

    def search_many(self, searches: Sequence[Search]) -> list[Hits]:
        tables, queries = [self._table(s.collection) for s in searches], []
        for s, table in zip(searches, tables):  # each checked before any is sent
            queries.append(base.check_vectors(s.collection, s.queries, table.dim))
            base.check_where(s.collection, s.where, table.attrs)
        record(1, sum(len(q) for q in queries))  # its KNNs sent at once, a few statements (_run)
        radii = [base.check_radius(s, q.shape[:1]) for s, q in zip(searches, queries)]
        pieces = []
        for si, (s, table, q) in enumerate(zip(searches, tables, queries)):
            if s.k != 0:
                spans, k = self._spans(s.collection, table), min(s.k or self.limit, self.limit)
                if radii[si] is not None:  # a scan, not a KNN: no limit on its k (-1: every row)
                    spans, k = [None], -1 if s.k is None else s.k
                pieces += [Piece(si, qi, span, k) for qi in range(len(q)) for span in spans]
        self._run(pieces, searches, tables, queries, radii)
        cut = {(p.si, p.qi) for p in pieces if radii[p.si] is None and self._cut(p, searches[p.si])}
        if cut:  # rows past sqlite-vec's k: the search again in ranges of at most k ids, each whole
            ranges = {si: self._ranges(tables[si]) for si, _ in cut}
            cut = {(si, qi) for si, qi in cut if ranges[si]}
            pieces = [p for p in pieces if (p.si, p.qi) not in cut]
            more = [Piece(si, qi, span, self.limit) for si, qi in sorted(cut) for span in ranges[si]]
            self._run(more, searches, tables, queries, radii)
            pieces += more
        return [
            hits(s, [[p.found for p in pieces if p.si == si and p.qi == qi] for qi in range(len(q))], t.dim, radius)
            for si, (s, t, q, radius) in enumerate(zip(searches, tables, queries, radii))
        ]

    def _cut(self, p: Piece, s: Search) -> bool:
        """Whether a piece may hold more rows than it returned: it asked for sqlite-vec's largest k and got it,
        and its range is wider than that."""
        wanted_all = s.k is None or s.k > self.limit
        narrow = p.span is not None and p.span[1] - p.span[0] <= self.limit
        return wanted_all and len(p.found.ids) == self.limit and not narrow

    def _run(self, pieces: list[Piece], searches, tables, queries, radii) -> None:
        """The pieces' KNNs (a radius search's scans) as a few statements run at once, one a thread, each a UNION ALL
        of up to ARMS of them."""
        statements = {}
        for p in pieces:
            key, s = (p.si, p.span is not None), searches[p.si]
            if key not in statements:
                statements[key] = (
                    knn.statement(tables[p.si], s.where, key[1], s.vectors)
                    if radii[p.si] is None
                    else knn.radius_statement(tables[p.si], s.where)
                )

        def arm(p: Piece) -> tuple[str, list]:
            text, values = statements[(p.si, p.span is not None)]
            if radii[p.si] is not None:
                return text, [queries[p.si][p.qi].tobytes(), *values, float(radii[p.si][p.qi]), p.k]
            return text, [queries[p.si][p.qi].tobytes(), p.k, *values, *(p.span or ())]

        def run(chunk: list[Piece]) -> None:
            if len(chunk) == 1:
                text, values = arm(chunk[0])
                chunk[0].found = knn.found(self.db.rows(text, values), searches[chunk[0].si].vectors)
                return
            arms = [arm(p) for p in chunk]
            wide = any(searches[p.si].vectors for p in chunk)  # a search without vectors gets NULL in their column
            pad = [", NULL" if wide and not searches[p.si].vectors else "" for p in chunk]
            text = " UNION ALL ".join(f"SELECT {j}, *{pad[j]} FROM ({t})" for j, (t, _) in enumerate(arms))
            rows: list[list[tuple]] = [[] for _ in chunk]
            for row in self.db.rows(text, [v for _, values in arms for v in values]):
                rows[row[0]].append(row[1:])
            for p, found in zip(chunk, rows):
                p.found = knn.found(found, searches[p.si].vectors)

        chunks = knn.chunks(pieces, 1 if self.threads < 2 else self.threads, ARMS)
        if len(chunks) < 2:
            for chunk in chunks:
                run(chunk)
        else:
            base.parallel([lambda c=c: run(c) for c in chunks], workers=self.threads)

    def _spans(self, name: str, table: Table) -> list[tuple[int, int] | None]:
        """A search's pieces: one per thread for a model's large table (ranges of its ids, the first and last
        open-ended so that they hold every row whatever was written since), else the whole table."""
        if self.threads < 2 or base.is_text(name) or self._size(name, table)[0] * table.dim < SPLIT_WORK:
            return [None]
        _, lo, hi = self._size(name, table)
        edges = np.linspace(lo, hi + 1, self.threads + 1).astype(np.int64).tolist()
        edges[0], edges[-1] = LOWEST, HIGHEST
        return [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]

    def _size(self, name: str, table: Table) -> tuple[int, int, int]:
        """(rows, lowest id, highest id) of a model's table, as first read: they only balance the threads."""
        if name not in self._sizes:
            n, lo, hi = self.db.rows(f"SELECT count(*), min(id), max(id) FROM {quoted(table.name)}")[0]
            self._sizes[name] = (n, lo or 0, hi or 0)
        return self._sizes[name]

    def _ranges(self, table: Table) -> list[tuple[int, int]]:
        """Ranges of at most `limit` ids covering every row now ([] if one such range is the whole table)."""
        lo, hi = self.db.rows(f"SELECT min(id), max(id) FROM {quoted(table.name)}")[0]
        return [] if lo is None or hi - lo < self.limit else knn.pieces(lo, hi + 1, self.limit)


def hits(s: Search, found: list[list[Found]], dim: int, radius=None) -> Hits:
    """A search's Hits [m, n] from each query's pieces (with vectors where it asked); every query saw as many rows,
    but in a radius search's (ragged Hits)."""
    width = dim if s.vectors else None
    if s.k == 0:
        return base.no_hits(len(found), width)
    rows = [knn.merged(parts, s.k) for parts in found]
    if radius is not None:
        return base.ragged([(f.ids, f.dists) for f in rows], s.k)
    if not rows or not any(len(f.ids) for f in rows):
        return base.no_hits(len(rows), width)
    if len({len(f.ids) for f in rows}) > 1:
        raise VecgptError(
            f"search in {s.collection!r}: queries got different numbers of rows (the collection changed?)"
        )
    out = Hits(base.stacked([f.ids for f in rows]), base.stacked([f.dists for f in rows]))
    if width is None:
        return out
    return out._replace(vectors=knn.floats([b for f in rows for b in f.vectors], dim).reshape(*out.ids.shape, dim))
