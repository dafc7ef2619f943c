"""search and search_many of the DuckDB store: a search is one statement, and the all-row searches of a
search_many (the key searches of every text in a step, one grouped search each) are one UNION ALL statement, each
arm reading its own query table, so a list of texts costs one request."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from vecgpt.backends import base
from vecgpt.backends.base import Hits, Search, Where, record, row_order
from vecgpt.backends.duckdb.records import duck_errors
from vecgpt.backends.duckdb.statements import Meta, floats, query_table, search_sql


class Plan(NamedTuple):
    """A search checked and ready to send: its collection, queries [m, dim] or [G, m, dim], filter, result shape."""

    s: Search
    meta: Meta
    queries: np.ndarray
    where: Where | None
    shape: tuple
    radius: np.ndarray | None  # a radius search's, of the queries' shape

    def sql(self, table: str) -> str:
        s = self.s
        return search_sql(self.meta, table, self.shape[-1], s.k, self.where, s.by, s.vectors, self.radius is not None)

    def columns(self) -> tuple:
        """What its statement's rows hold: searches alike in this go in one UNION ALL."""
        return bool(self.s.by), self.meta.dim if self.s.vectors else None


class Searching:
    """Mixed into DuckStore, which gives con, _col and _registered."""

    def search(self, name, queries, k=None, where=None) -> Hits:
        return self.search_many([Search(name, queries, k, where)])[0]

    @duck_errors
    def search_many(self, searches: Sequence[Search]) -> list[Hits]:
        """Each search checked in turn (the first bad one is the error), then the all-row searches alike in their
        columns sent as one statement, a top-k search as one of its own. A query's distances are DuckDB's distance
        function of it and a row, whatever else the statement holds: the same bits as the search alone."""
        out: list = [self._plan(s) for s in searches]
        alike: dict[tuple, list[int]] = {}
        for j, plan in enumerate(out):
            if isinstance(plan, Plan):
                if plan.s.k is None:
                    alike.setdefault(plan.columns(), []).append(j)
                else:
                    out[j] = self._send([plan])[0]
        for together in alike.values():
            for j, found in zip(together, self._send([out[j] for j in together])):
                out[j] = found
        return out

    def _plan(self, s: Search) -> Plan | Hits:
        """A search checked, or its Hits where it needs no statement (no queries, k = 0, a grouped top-k)."""
        meta = self._col(s.collection)
        if s.by:
            queries = base.check_grouped(s.collection, s.queries, meta.dim)
            where = base.group_filter(s)
            base.check_attributes(s.collection, where.attributes() | {s.by}, meta.attrs)
        else:
            queries, where = base.check_vectors(s.collection, s.queries, meta.dim), s.where
            base.check_where(s.collection, where, meta.attrs)
        shape = queries.shape[:-1]  # (m,), or (groups, m)
        radius = base.check_radius(s, shape)
        if queries.size == 0 or s.k == 0:
            return empty(shape, meta.dim if s.vectors else None)
        if s.by and s.k is not None:  # a top-k of each group (no caller sends one): a search per group
            return base.apart(lambda plain: [self._one(p) for p in plain], [s])[0]
        return Plan(s, meta, queries, where, shape, radius)

    def _one(self, s: Search) -> Hits:
        plan = self._plan(s)
        return plan if isinstance(plan, Hits) else self._send([plan])[0]

    def _send(self, plans: list[Plan]) -> list[Hits]:
        """One statement for the plans (alike in their columns; one if any has k): each reads its own query table,
        its rows tagged by its place (s) when there are several."""
        record(1, sum(int(np.prod(p.shape)) for p in plans))
        names = [f"vecgpt_queries_{j}" if j else "vecgpt_queries" for j in range(len(plans))]
        with ExitStack() as registered:
            for name, plan in zip(names, plans):
                registered.enter_context(self._registered(name, query_table(plan.queries, plan.radius)))
            if len(plans) == 1:
                return [hits(plans[0], self.con.sql(plans[0].sql(names[0])).to_arrow_table())]
            result = self.con.sql(self._union(plans, names)).to_arrow_table()
        which = result["s"].to_numpy()
        order = np.argsort(which, kind="stable")
        ends = np.searchsorted(which[order], np.arange(1, len(plans) + 1))
        return [hits(p, result.take(order[a:b])) for p, a, b in zip(plans, [0, *ends[:-1].tolist()], ends.tolist())]

    @staticmethod
    def _union(plans: list[Plan], names: list[str]) -> str:
        return " UNION ALL ".join(
            f"(SELECT {j} AS s, * FROM ({p.sql(n)}))" for j, (p, n) in enumerate(zip(plans, names))
        )


def empty(shape: tuple, dim: int | None) -> Hits:
    vectors = None if dim is None else np.zeros((*shape, 0, dim), np.float32)
    return Hits(np.zeros((*shape, 0), np.int64), np.zeros((*shape, 0)), vectors)


def within(plan: Plan, key: np.ndarray, result: pa.Table) -> Hits:
    """A radius search's rows (query `key`, any order) as ragged Hits: the statement kept each query's within its
    radius (and k)."""
    dists = result["d"].to_numpy().astype(np.float64)
    dists = dists**2 if plan.meta.metric == "l2" else dists
    rows = base.by_query(key, result["id"].to_numpy(), dists, int(np.prod(plan.shape)))
    return base.ragged(rows, plan.s.k, plan.shape)


def hits(plan: Plan, result: pa.Table) -> Hits:
    """A search's rows as Hits [*shape, n]: rows come by query (sorted here when the statement did not), each query's
    rows in any order (k: nearest first). l2 distances are squared in float64, exactly."""
    name, meta, shape = plan.s.collection, plan.meta, plan.shape
    every = plan.s.k is None and not plan.s.by
    key = result["i"].to_numpy()
    if len(shape) == 2:  # grouped: query i of group g
        key = result["g"].to_numpy() * shape[1] + key
    if plan.radius is not None:
        return within(plan, key, result)
    order = None if np.all(key[:-1] <= key[1:]) else np.argsort(key, kind="stable")
    counts = np.bincount(key, minlength=int(np.prod(shape))).reshape(-1, shape[-1])
    base.check_groups(name, counts[:, 0].tolist())
    n = int(counts[0, 0])
    ids, dists = result["id"].to_numpy(), result["d"].to_numpy()
    if order is not None:
        ids, dists = ids[order], dists[order]
    dists = dists.astype(np.float64) ** 2 if meta.metric == "l2" else dists
    ids = ids.reshape(*shape, n)
    if every and n and np.array_equal(ids, np.broadcast_to(row_order(n), ids.shape)):
        ids = np.broadcast_to(row_order(n), ids.shape)  # the engine then knows the row order without comparing
    vectors = None
    if "rv" in result.column_names:
        vectors = floats(result["rv"], meta.dim)
        vectors = (vectors if order is None else vectors[order]).reshape(*shape, n, meta.dim)
    return Hits(ids, dists.reshape(*shape, n), vectors)
