"""Searches of the LanceDB store: a search_many's searches sent to LanceDB's event loop in one hop, and the filtered
all-row searches of one table (a layer's heads: a text's key search) one query of that table, whatever other
tables' searches come with them (docs/lancedb.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import ExitStack

import numpy as np
import pyarrow as pa

from vecgpt.backends import base
from vecgpt.backends.base import Hits, Search, record
from vecgpt.backends.lancedb.table import (
    Table,
    floats,
    lance_errors,
    on_this_thread,
    sql,
    union,
)


class Searching:
    """Mixed into LanceStore, which gives _table."""

    def search(self, name, queries, k=None, where=None) -> Hits:
        return self._searches([Search(name, queries, k, where)])[0]

    def search_many(self, searches: Sequence[Search]) -> list[Hits]:
        """Filtered all-row searches of one table (a layer's heads: one text's key search) as one query each table,
        whatever other tables' searches come with them (every text of a step); the rest in one hop."""
        tables: dict[str, list[int]] = {}
        for j, s in enumerate(searches):
            tables.setdefault(s.collection, []).append(j)
        unions = [
            js
            for js in tables.values()
            if len(js) > 1
            and all(searches[j].k is None and searches[j].where is not None for j in js)
            and not any(searches[j].vectors or searches[j].radius is not None for j in js)
        ]
        out: list = [None] * len(searches)
        rest = sorted(set(range(len(searches))) - {j for js in unions for j in js})
        for js in unions:
            for j, found in zip(js, self._search_union([searches[j] for j in js])):
                out[j] = found
        for j, found in zip(rest, self._searches([searches[j] for j in rest]) if rest else []):
            out[j] = found
        return out

    @lance_errors
    def _searches(self, searches: Sequence[Search]) -> list[Hits]:
        """Searches sent to LanceDB's event loop in one hop and run there concurrently (a round's 12 heads'
        projections: one hop, not 12 threads' hops, each paying the runtime's fixed cost; docs/lancedb.md)."""
        tables = [self._table(s.collection) for s in searches]
        queries = [base.check_vectors(s.collection, s.queries, t.dim) for s, t in zip(searches, tables)]
        radii = [base.check_radius(s, q.shape[:1]) for s, q in zip(searches, queries)]
        for s, t, q, r in zip(searches, tables, queries, radii):
            base.check_where(s.collection, s.where, t.attrs)
            record(1 if r is None else len(np.unique(r)), len(q))  # a radius search: a query for each radius
        with ExitStack() as held:
            for table in {id(t): t for t in tables}.values():
                held.enter_context(table.lock.read())
            limits = [t.row_count() if s.k is None else min(s.k, t.row_count()) for s, t in zip(searches, tables)]
            sent = [
                nearest(t, q, n, s.where, s.vectors) if r is None else within(t, q, r, n, s.where)
                for s, t, q, n, r in zip(searches, tables, queries, limits, radii)
                if n and len(q)
            ]
            found = iter(on_this_thread(gather(*sent)))
        return [
            (hits(next(found), t, len(q)) if r is None else base.ragged(next(found), s.k))
            if n and len(q)
            else base.no_hits(len(q), t.dim if s.vectors else None)
            for s, t, q, n, r in zip(searches, tables, queries, limits, radii)
        ]

    @lance_errors
    def _search_union(self, searches: Sequence[Search]) -> list[Hits]:
        """Filtered all-row searches of one table (a layer's heads) as one query: every query vector against the
        rows any filter keeps (the conditions all filters share once, docs/lancedb.md), then each search keeps its
        own matches. Of the shared conditions, LanceDB is sent those its bitmap indexes answer (the layer) where
        there are such; the rest (the position range) are tested here on the rows it returns, which costs less than
        LanceDB's filter on them (docs/lancedb.md)."""
        table = self._table(searches[0].collection)
        queries = [base.check_vectors(s.collection, s.queries, table.dim) for s in searches]
        for s in searches:
            base.check_where(s.collection, s.where, table.attrs)
        shared = frozenset.intersection(*(frozenset(s.where.conditions()) for s in searches))
        sent = frozenset(c for c in shared if c[1] in table.indexed) or shared
        own = [s.where.conditions() - shared for s in searches]
        here = [conditions | (shared - sent) for conditions in own]  # what each search's rows are tested for here
        columns = sorted({name for conditions in here for _, name, _ in conditions})
        stacked = np.vstack(queries)
        record(1, len(stacked))
        with table.lock.read():
            limit = max(table.row_count(), 1)
            result = on_this_thread(table.nearest(stacked, ["id", "_distance", *columns], limit, union(sent, own)))
        order = np.argsort(result["query_index"].to_numpy(), kind="stable")
        which = result["query_index"].to_numpy()[order]
        ids, dists = result["id"].to_numpy()[order], table.distances(result)[order]
        attrs = {c: result[c].to_numpy()[order] for c in columns}
        ends = np.searchsorted(which, np.cumsum([len(q) for q in queries]))  # rows of search i: which < ends[i]
        out, start = [], 0
        for q, conditions, end in zip(queries, here, ends.tolist()):
            keep = base.matching(conditions, {c: attrs[c][start:end] for c in columns}, end - start)
            n = int(keep.sum()) // max(len(q), 1)
            out.append(Hits(ids[start:end][keep].reshape(len(q), n), dists[start:end][keep].reshape(len(q), n)))
            start = end
        return out


async def nearest(table: Table, queries: np.ndarray, limit: int, where, vectors: bool) -> pa.Table:
    """One search's rows (with vectors, their stored vectors too); the ids are read with them until a search of
    every row has shown the table's _rowids."""
    known = table.rowids is not None
    columns = (["_distance"] if known else ["id", "_distance"]) + (["vector"] if vectors else [])
    result = await table.nearest(queries, columns, limit, sql(where))
    if not known:
        table.knows_rowids(result, every_row=where is None and limit == table.rows)
    return result


async def within(table: Table, queries: np.ndarray, radius: np.ndarray, limit: int, where) -> list[tuple]:
    """A radius search, each query's (ids, dists): LanceDB's distance range, a query for each radius (it takes one
    for all its vectors), its upper bound (exclusive, on LanceDB's float32 _distance) the float32 after the last
    whose distance as the store gives it is <= the radius (ip: 1 - x.y, less 1), so a row exactly at it is kept."""
    out: list = [None] * len(queries)
    for r in np.unique(radius).tolist():
        at = np.flatnonzero(radius == r)
        last = base.float32_at_most(r, table.distance_of, r + 1.0 if table.metric == "ip" else r)
        upper = np.nextafter(last, np.float32(np.inf))
        result = await table.nearest(queries[at], ["id", "_distance"], limit, sql(where), float(upper))
        which = result["query_index"].to_numpy() if "query_index" in result.column_names else np.zeros(len(result))
        rows = base.by_query(which.astype(np.int64), result["id"].to_numpy(), table.distances(result), len(at))
        for i, found in zip(at.tolist(), rows):
            out[i] = found
    return out


async def gather(*searches):
    return await asyncio.gather(*searches)


def hits(result: pa.Table, table: Table, m: int) -> Hits:
    """A search's rows as [m, n] ids and distances, query by query (rows come grouped by query; made sure of)."""
    grouped = "query_index" in result.column_names
    order = np.argsort(result["query_index"].to_numpy(), kind="stable") if grouped else slice(None)
    ids, dists = table.ids_of(result)[order], table.distances(result)[order]
    n = len(ids) // m
    found = Hits(ids.reshape(m, n), dists.reshape(m, n))
    if "vector" in result.column_names:
        found = found._replace(vectors=floats(result["vector"], table.dim)[order].reshape(m, n, table.dim))
    return found
