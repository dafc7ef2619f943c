"""Search and fetch: every query vector is one kNN subquery, sent in multi_query requests across replicas and
parts; a result that may be cut at the row limit is split by id ranges and asked again (docs/turbopuffer.md)."""

from __future__ import annotations

import base64
import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from vecgpt.backends.base import (
    Hits,
    Search,
    Where,
    check_found,
    check_radius,
    check_vectors,
    check_where,
    parallel,
    ragged,
)
from vecgpt.backends.turbopuffer.filters import MATCH_ALL, range_of, strip_range, to_filter, with_range
from vecgpt.backends.turbopuffer.plumbing import KNN_SLOTS, MAX_SUBQUERIES
from vecgpt.errors import VecgptError


class Task:
    """One kNN subquery: query vector `qi` of search `si`, on these replica namespaces, with this filter."""

    __slots__ = ("si", "qi", "replicas", "filter", "limit", "want", "ids", "dists", "vectors", "radius")

    def __init__(self, si, qi, replicas, filt, limit, want=None, radius=None):
        self.si, self.qi, self.replicas, self.filter, self.limit = si, qi, replicas, filt, limit
        self.want = want  # the rows' vectors too, this wide (None: not)
        self.radius = radius  # a radius search's page: asked again, twice as long, while its rows are all within
        self.ids = self.dists = self.vectors = None

    def full(self) -> bool:
        """Rows may have been left out: it got as many as it asked for (and, a radius search's page, all within)."""
        within = self.radius is None or not len(self.ids) or self.dists.max() <= self.radius
        return len(self.ids) >= self.limit and within


class Searching:
    """search, search_many and fetch of a TurbopufferStore."""

    first_page = 128  # rows a radius search's subquery asks for first (then twice as many, and so on)

    def search(self, name, queries, k=None, where=None) -> Hits:
        return self.search_many([Search(name, queries, k, where)])[0]

    def search_many(self, searches: Sequence[Search]) -> list[Hits]:
        """Every query vector of every search is one subquery; all of them go out at once. turbopuffer has no range
        query: a radius search's subquery asks for the nearest `first_page` rows, then twice as many while every row
        that came was within the radius (up to max_top_k, then split by id ranges as any search)."""
        tasks, shapes = [], []
        for si, s in enumerate(searches):
            spec = self._spec(s.collection)
            q = check_vectors(s.collection, s.queries, spec["dim"])
            check_where(s.collection, s.where, spec["attrs"])
            radius = check_radius(s, q.shape[:1])
            limit = self.max_top_k if s.k is None or s.k > self.max_top_k else s.k
            limit = limit if radius is None else min(limit, self.first_page)
            want = spec["dim"] if s.vectors else None  # the rows' vectors too, this wide
            shapes.append((q, s.k, want, radius))
            for replicas, filt in self._targets(s.collection, spec, s.where):
                tasks += [
                    Task(si, qi, replicas, filt, limit, want, None if radius is None else radius[qi])
                    for qi in range(len(q))
                ]
        queries = [shape[0] for shape in shapes]
        self._run(tasks, queries)
        self._pages(tasks, queries, [shape[1] for shape in shapes])
        cut = [t for t in tasks if t.full() and (shapes[t.si][1] is None or shapes[t.si][1] > t.limit)]
        while cut:  # results that may be cut short at the row limit: split by id ranges and ask again
            gone = set(cut)
            tasks = [t for t in tasks if t not in gone]
            more = [piece for t in cut for piece in self._split(t)]
            self._run(more, queries)
            tasks += more
            cut = [t for t in more if len(t.ids) >= t.limit]
        return [
            self._assemble(q, k, [t for t in tasks if t.si == si], want, radius)
            for si, (q, k, want, radius) in enumerate(shapes)
        ]

    def _pages(self, tasks: list[Task], queries: list[np.ndarray], ks: list[int | None]) -> None:
        """A radius search's subqueries whose rows all lay within the radius, asked again for twice as many rows
        until one lies beyond it, fewer rows match, k rows came, or they ask for max_top_k."""
        most = [self.max_top_k if k is None else min(k, self.max_top_k) for k in ks]
        more = [t for t in tasks if t.radius is not None]
        while more := [t for t in more if t.full() and t.limit < most[t.si]]:
            for t in more:
                t.limit = min(2 * t.limit, most[t.si])
            self._run(more, queries)

    def _targets(self, name: str, spec: dict, where: Where | None) -> list[tuple[list[str], list]]:
        part = spec["partition"]
        if part is None:
            return [(self._replicas(self._base(name), spec["replicas"]), to_filter(where))]
        if where is not None and part in where.eq:
            return [(self._replicas(self._base(name, int(where.eq[part])), spec["replicas"]), to_filter(where, part))]
        return [(group, to_filter(where)) for group in self._groups(name, spec)]

    def _run(self, tasks: list[Task], queries: list[np.ndarray]) -> None:
        groups = defaultdict(list)
        for t in tasks:
            groups[tuple(t.replicas)].append(t)
        calls = []
        for replicas, group in groups.items():
            size = max(1, min(self.per_request, math.ceil(len(group) / len(replicas))))
            for start in range(0, len(group), size):
                chunk = group[start : start + size]
                calls.append(lambda r=list(replicas), c=chunk: self._send(r, c, queries))
        parallel(calls, workers=max(16, min(len(calls), 128)))

    def _send(self, replicas: list[str], chunk: list[Task], queries: list[np.ndarray]) -> None:
        need = KNN_SLOTS * len(chunk)
        subs = [
            {"rank_by": ["vector", "kNN", queries[t.si][t.qi].tolist()], "top_k": t.limit, "filters": t.filter}
            | ({"include_attributes": ["vector"]} if t.want is not None else {})
            for t in chunk
        ]
        encoding = {"vector_encoding": "base64"} if any(t.want is not None for t in chunk) else {}
        ns = self.gate.acquire(replicas, need)
        try:
            if len(subs) == 1:
                results = [self._query(ns, {**subs[0], **encoding}, "search")]
            else:
                results = self._query(ns, {"queries": subs, **encoding}, "search", subqueries=len(subs))["results"]
        finally:
            self.gate.release(ns, need)
        for t, res in zip(chunk, results):
            rows = res.get("rows", [])
            t.ids = np.fromiter((r["id"] for r in rows), np.int64, len(rows))
            t.dists = np.fromiter((r["$dist"] for r in rows), np.float64, len(rows))
            if t.want is not None:
                t.vectors = np.zeros((len(rows), t.want), np.float32)
                for row, r in enumerate(rows):
                    t.vectors[row] = vector(r["vector"])

    def _split(self, t: Task) -> list[Task]:
        """Pieces of a subquery that may have been cut at the row limit: id ranges, each asked again."""
        rng = range_of(t.filter)
        if rng is not None:  # a piece that is still too big: halve it
            (lo, hi), pieces = rng, 2
        else:
            lo, hi = self._span(t.replicas[0])
            pieces = max(2, math.ceil(2 * (hi - lo) / t.limit))
        edges = np.unique(np.linspace(lo, hi, pieces + 1).astype(np.int64))
        base = strip_range(t.filter)
        return [
            Task(t.si, t.qi, t.replicas, with_range(base, a, b), t.limit, t.want)
            for a, b in zip(edges[:-1].tolist(), edges[1:].tolist())
            if b > a
        ]

    def _span(self, ns: str) -> tuple[int, int]:
        """[0, largest id + 1) of a namespace (one request, then cached)."""
        span = self._spans.get(ns)
        if span is None:
            out = self._query(ns, {"rank_by": ["id", "desc"], "top_k": 1, "filters": MATCH_ALL}, "id range")
            rows = out.get("rows", [])
            span = self._spans[ns] = (0, int(rows[0]["id"]) + 1 if rows else 1)
        return span

    def _assemble(self, q: np.ndarray, k: int | None, tasks: list[Task], dim: int | None, radius=None) -> Hits:
        """One search's Hits from its subqueries' rows (dim: with the rows' vectors, that wide; radius: those within
        each query's, as ragged Hits)."""
        m = len(q)
        per = [[t for t in tasks if t.qi == i] for i in range(m)]
        ids = [np.concatenate([t.ids for t in ts]) if ts else np.zeros(0, np.int64) for ts in per]
        dists = [np.concatenate([t.dists for t in ts]) if ts else np.zeros(0) for ts in per]
        if radius is not None:
            return ragged([(i[d <= r], d[d <= r]) for i, d, r in zip(ids, dists, radius.tolist())], k)
        rows = (
            [np.vstack([t.vectors for t in ts]) if ts else np.zeros((0, dim), np.float32) for ts in per]
            if dim
            else None
        )
        if k is not None:
            for i in range(m):
                order = np.lexsort((ids[i], dists[i]))[:k]
                ids[i], dists[i] = ids[i][order], dists[i][order]
                if rows is not None:
                    rows[i] = rows[i][order]
        n = {len(x) for x in ids}
        if len(n) > 1:
            raise VecgptError(
                "turbopuffer returned different row counts for the query vectors of one search "
                "(the collection changed during it?)"
            )
        found = Hits(np.stack(ids) if m else np.zeros((0, 0), np.int64), np.stack(dists) if m else np.zeros((0, 0)))
        if rows is not None:
            found = found._replace(vectors=np.stack(rows) if m else np.zeros((0, 0, dim), np.float32))
        return found

    def fetch(self, name, ids, payload=False):
        """Rows by id: every part is asked for every id (a row's part is not known from its id), in chunks of
        at most max_top_k ids, up to `slots` chunks a multi_query; all requests in one wave."""
        spec = self._spec(name)
        ids = np.asarray(ids, np.int64)
        wanted = np.unique(ids)
        width = spec.get("payload", 0)
        first_only = spec["partition"] or (payload and width)  # the payload is kept in a collection's first copy
        spaces = [group[:1] if first_only else group for group in self._groups(name, spec)]
        found: dict[int, dict] = {}
        chunks = [wanted[i : i + self.max_top_k].tolist() for i in range(0, len(wanted), self.max_top_k)]
        per = max(1, min(MAX_SUBQUERIES, self.slots))
        parallel(
            [
                lambda r=r, c=chunks[i : i + per]: self._fetch_rows(name, r, c, payload and width, found)
                for r in spaces
                for i in range(0, len(chunks), per)
            ]
        )
        check_found(name, wanted, found)
        vectors = np.zeros((len(ids), spec["dim"]), np.float32)
        for row, i in enumerate(ids.tolist()):
            vectors[row] = found[i]["vector"]
        if not payload:
            return vectors
        values = np.zeros((len(ids), width), np.float32)
        for row, i in enumerate(ids.tolist() if width else []):
            held = found[i].get("payload")
            if held is not None:  # else written without one: zeros
                values[row] = np.frombuffer(base64.b64decode(held), "<f4")
        return vectors, values

    def _fetch_rows(self, name: str, replicas: list[str], chunks: list[list[int]], payload, found: dict) -> None:
        """One request (a query, or a multi_query of several chunks) for these ids, on the least busy copy."""
        attrs = ["vector", "payload"] if payload else ["vector"]
        subs = [
            {"rank_by": ["id", "asc"], "top_k": len(c), "filters": ["id", "In", c], "include_attributes": attrs}
            for c in chunks
        ]
        ns = self.gate.acquire(replicas, len(subs))
        try:
            if len(subs) == 1:
                results = [self._query(ns, {**subs[0], "vector_encoding": "base64"}, "fetch")]
            else:
                body = {"queries": subs, "vector_encoding": "base64"}
                results = self._query(ns, body, "fetch", subqueries=len(subs))["results"]
        finally:
            self.gate.release(ns, len(subs))
        for res in results:
            for r in res.get("rows", []):
                r["vector"] = vector(r["vector"])
                if int(r["id"]) in found:
                    raise VecgptError(
                        f"id {r['id']} of collection {name!r} is held in two of its parts (its partition "
                        f"attribute changed in another process); drop the collection and write it again"
                    )
                found[int(r["id"])] = r


def vector(v) -> np.ndarray:
    """A row's vector as turbopuffer sends it: base64 of little-endian float32, or a list of numbers."""
    return np.frombuffer(base64.b64decode(v), "<f4") if isinstance(v, str) else np.asarray(v, np.float32)
