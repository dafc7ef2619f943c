"""Searches of the Milvus store: a request per search (Milvus takes one filter a request: a grouped search is a
search per group), its queries and answers in as few requests as its limits allow, a search of more rows than Milvus
returns at once split by id range."""

from __future__ import annotations

import functools

import numpy as np

from vecgpt.backends import base
from vecgpt.backends.base import Hits, Search, record
from vecgpt.backends.milvus.client import every_row, milvus_errors
from vecgpt.backends.milvus.requests import (
    expression,
    hit_arrays,
    hit_vectors,
    joined,
    nearest,
    query_batches,
    within,
)
from vecgpt.backends.milvus.schema import Info
from vecgpt.errors import VecgptError


class Searching:
    """Mixed into MilvusStore, which gives client, concurrent, limits, _get, _name and _held_ids."""

    def search(self, name, queries, k=None, where=None) -> Hits:
        return self.search_many([Search(name, queries, k, where)])[0]

    def search_many(self, searches) -> list[Hits]:
        return base.apart(self._search_many, searches)

    @milvus_errors
    def _search_many(self, searches) -> list[Hits]:
        calls = [functools.partial(self._search, s) for s in searches]
        return base.parallel(calls) if self.concurrent and len(calls) > 1 else [call() for call in calls]

    def _search(self, s: Search) -> Hits:
        info = self._get(s.collection)
        queries = base.check_vectors(s.collection, s.queries, info.dim)
        base.check_where(s.collection, s.where, info.attrs)
        radius = base.check_radius(s, queries.shape[:1])
        if len(queries) == 0 or s.k == 0:
            return base.no_hits(len(queries), info.dim if s.vectors else None)
        if radius is not None:
            return self._within(s, info, queries, radius)
        top = self.limits.top_k
        if s.k is not None and s.k > top:
            return self._by_ranges(s, info, queries)
        found = self._requests(s, info, queries, top if s.k is None else s.k, expression(s.where))
        if s.k is None and found.ids.shape[1] == top and self._matching(s) > top:  # more rows match than came
            return self._by_ranges(s, info, queries)
        return found

    def _requests(self, s: Search, info: Info, queries: np.ndarray, limit: int, condition: str) -> Hits:
        """One search, in as many requests as its queries and their answers need."""
        hit_bytes = 12 + (4 * info.dim if s.vectors else 0)
        parts = query_batches(len(queries), info.dim, limit, hit_bytes, self.limits)
        found = [self._request(s, info, queries[part], limit, condition) for part in parts]
        if len({h.ids.shape[1] for h in found}) > 1:
            raise VecgptError(f"rows of {s.collection!r} changed during a search of it; search again")
        return joined(found, axis=0)

    def _request(self, s: Search, info: Info, queries: np.ndarray, limit: int, condition: str) -> Hits:
        # Only the ids (Milvus Lite sends every field, vectors too, when none are named: three times the time)
        fields = ["vector"] if s.vectors else ["id"]
        record(1, len(queries))
        result = self.client.search(
            self._name(s.collection), queries, filter=condition, limit=limit, output_fields=fields
        )
        ids, dists = hit_arrays(result, len(queries), negate=info.metric == "ip")
        vectors = hit_vectors(result, *ids.shape, info.dim) if s.vectors else None
        return Hits(ids, dists, vectors)

    def _within(self, s: Search, info: Info, queries: np.ndarray, radius: np.ndarray) -> Hits:
        """A radius search: Milvus's range search, a request for each radius (a search takes one); where a query got
        as many rows as Milvus returns at once and more may lie within, the search again by id ranges."""
        top = self.limits.top_k
        limit = top if s.k is None else min(s.k, top)
        found = self._ranged(s, info, queries, radius, limit, expression(s.where))
        if (s.k is None or s.k > top) and any(len(ids) >= top for ids, _ in found):
            parts = [
                self._ranged(s, info, queries, radius, top, c) for c in within(s.where, self._ids(s.collection), top)
            ]
            found = [tuple(np.concatenate(rows) for rows in zip(*pieces)) for pieces in zip(*parts)]
        return base.ragged(found, s.k)

    def _ranged(self, s, info: Info, queries: np.ndarray, radius: np.ndarray, limit: int, condition: str) -> list:
        """Each query's (ids, dists) within its radius, at most `limit`. Milvus keeps an l2 distance d < radius, an
        inner product p > radius (in float32): the radius sent is the float32 next to the last distance kept
        (base.float32_at_most), so a row exactly at it is kept."""
        out: list = [None] * len(queries)
        for r in np.unique(radius).tolist():
            at = np.flatnonzero(radius == r)
            last = base.float32_at_most(r)
            bound = np.nextafter(last, np.float32(np.inf)) if info.metric == "l2" else np.nextafter(-last, -np.inf)
            params = {"params": {"radius": float(bound)}}
            for part in query_batches(len(at), info.dim, limit, 12, self.limits):
                record(1, len(at[part]))
                result = self.client.search(
                    self._name(s.collection),
                    queries[at[part]],
                    filter=condition,
                    limit=limit,
                    output_fields=["id"],
                    search_params=params,
                )
                for i, hits in zip(at[part].tolist(), result):
                    d = np.array(hits.distances, np.float64)
                    out[i] = (np.array(hits.ids, np.int64), -d if info.metric == "ip" else d)
        return out

    def _matching(self, s: Search) -> int:
        record()
        stored = self._name(s.collection)
        return int(self.client.query(stored, filter=expression(s.where), output_fields=["count(*)"])[0]["count(*)"])

    def _by_ranges(self, s: Search, info: Info, queries: np.ndarray) -> Hits:
        """A search of more rows than Milvus returns at once (every token row, for every logit): a search per
        range of ids holding at most that many rows, then each query's nearest k of all of them."""
        top = self.limits.top_k
        limit = top if s.k is None else min(s.k, top)
        parts = [self._requests(s, info, queries, limit, c) for c in within(s.where, self._ids(s.collection), top)]
        found = joined(parts, axis=1)
        return found if s.k is None else nearest(found, s.k)

    def _ids(self, name: str) -> np.ndarray:
        """Every id a collection holds, sorted (a model's kept until this process writes it)."""
        if name in self._held_ids and not base.is_text(name):
            return self._held_ids[name]
        rows = every_row(self.client, self._name(name), ["id"], self.limits.top_k)
        ids = [row["id"] for batch in rows for row in batch]
        self._held_ids[name] = np.sort(np.array(ids, np.int64))
        return self._held_ids[name]
