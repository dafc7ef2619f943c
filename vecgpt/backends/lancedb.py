"""LanceDB, embedded: one Lance table per collection in a folder (`path`, default ~/.cache/vecgpt/lancedb).

Search is exact: a flat scan (`bypass_vector_index()`, so an index built on a table is never
used), filters applied before the scan (`prefilter=True`), every query vector of a call sent in one
request (the results carry `query_index`). LanceDB gives `_distance` in float32: squared L2 for
"l2", and 1 - x.y for its "dot", which becomes the protocol's -x.y here (minus 1, in float64).
A search for every row asks for a limit of the table's row count.

Writes go in as Arrow tables: `add` for ids the table does not hold yet, `merge_insert` on `id`
where some are already there (an upsert), so writing the same rows twice leaves one copy.

Every write commits a new table version with a new small fragment, and a search pays for every
fragment. So a table is compacted, and its old versions removed, every `compact_every` writes to
it (the attention keys get one write per layer per token: 12 writes is one token), and every
table written since its last compaction is compacted when the manifest is written (the end of a
load). At a compaction, a table of `index_rows` rows or more gets a bitmap index on each of
`index_attrs` ("layer", "head"): a key search then reads only its own head's keys instead of
every key of the text. A compaction must not remove files that a search in another thread still
reads: searches hold a table's read lock, writes and compactions its write lock.

Table metadata (dimension, metric, attributes) lives in the Arrow schema's metadata; the manifest
is manifest.json beside the tables. One process writes a store at a time: the ids of a table are
cached in memory once read, to tell adds from upserts.
"""

from __future__ import annotations

import functools
import json
import threading
import warnings
from collections.abc import Sequence
from contextlib import contextmanager
from datetime import timedelta

import lancedb
import numpy as np
import pyarrow as pa
from lancedb.index import Bitmap

from vecgpt.backends.base import (
    FolderStore,
    Hits,
    Metric,
    Search,
    Where,
    check_found,
    check_metric,
    check_rows,
    check_same,
    check_vectors,
    check_where,
    last_writes,
    no_collection,
    parallel,
    record,
)
from vecgpt.errors import VecgptError

DISTANCE = {"l2": "l2", "ip": "dot"}
RESERVED = {"id", "vector"}


class RWLock:
    """Many readers or one writer."""

    def __init__(self):
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False

    @contextmanager
    def read(self):
        with self._cond:
            while self._writing:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextmanager
    def write(self):
        with self._cond:
            while self._writing or self._readers:
                self._cond.wait()
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


class Table:
    """An open Lance table and what this process knows about it."""

    def __init__(self, handle):
        self.handle = handle
        meta = {k.decode(): v.decode() for k, v in (handle.schema.metadata or {}).items()}
        self.dim = int(meta["vecgpt.dim"])
        self.metric: Metric = meta["vecgpt.metric"]
        self.attrs: list[str] = json.loads(meta["vecgpt.attrs"])
        self.lock = RWLock()
        self.ids: set[int] | None = None  # the ids held, read on the first upsert
        self.rows: int | None = None  # row count, kept up to date by this process's writes
        self.writes = 0  # writes since the last compaction
        self.indexed = {c for index in handle.list_indices() for c in index.columns}

    def row_count(self) -> int:
        if self.rows is None:
            self.rows = self.handle.count_rows()
        return self.rows

    def held_ids(self) -> set[int]:
        if self.ids is None:
            rows = self.row_count()
            arrow = self.handle.search().select(["id"]).limit(rows).to_arrow() if rows else None
            self.ids = set(arrow["id"].to_numpy().tolist()) if arrow is not None else set()
        return self.ids


def lance_errors(method):
    """Lance's own errors (a table's files missing, cut short or garbled) as one-line VecgptErrors."""
    @functools.wraps(method)
    def wrapped(self, *args, **kw):
        try:
            return method(self, *args, **kw)
        except (OSError, RuntimeError, ValueError, pa.ArrowException) as e:
            raise self.damaged(f"{method.__name__} failed, its files may be damaged", e) from None
    return wrapped


def sql(where: Where | None) -> str | None:
    if where is None:
        return None
    terms = [f"{a} = {int(v)}" for a, v in where.eq.items()] + [f"{a} < {int(v)}" for a, v in where.lt.items()] \
        + [f"{a} >= {int(v)}" for a, v in where.ge.items()]
    return " AND ".join(terms) or None


class LanceStore(FolderStore):
    metrics: tuple[Metric, ...] = ("l2", "ip")
    backend = "lancedb"

    def __init__(self, path: str | None = None, compact_every: int = 12, concurrent: bool = True,
                 index_attrs: Sequence[str] = ("layer", "head"), index_rows: int = 2048):
        super().__init__(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.db = lancedb.connect(str(self.path))
        self.compact_every = compact_every
        self.concurrent = concurrent  # the engine may send a round's requests from several threads
        self.index_attrs, self.index_rows = tuple(index_attrs), index_rows
        self._tables: dict[str, Table] = {}
        self._lock = threading.Lock()  # guards _tables

    # collections
    @lance_errors
    def create(self, name: str, dim: int, metric: Metric, attrs: Sequence[str] = ()) -> None:
        check_metric(self.backend, metric, self.metrics)
        if set(attrs) & RESERVED:
            raise VecgptError(f"attribute names {sorted(RESERVED)} are reserved")
        table = self._open(name)
        if table is not None:
            check_same(name, (table.dim, table.metric), dim, metric)
            return
        schema = pa.schema([pa.field("id", pa.int64()), pa.field("vector", pa.list_(pa.float32(), dim))]
                           + [pa.field(a, pa.int64()) for a in attrs],
                           metadata={"vecgpt.dim": str(dim), "vecgpt.metric": metric, "vecgpt.attrs": json.dumps(list(attrs))})
        handle = self.db.create_table(name, schema=schema, exist_ok=True)
        table = Table(handle)
        table.ids, table.rows = set(), 0
        with self._lock:
            self._tables[name] = table

    @lance_errors
    def upsert(self, name, ids, vectors, attrs=None) -> None:
        table = self._table(name)
        ids, vectors = check_rows(name, ids, vectors, table.dim)
        if len(ids) == 0:
            return
        ids, vectors, attrs = last_writes(ids, vectors, attrs or {}, table.attrs)
        columns = [pa.array(ids), pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(vectors).ravel()), table.dim)]
        columns += [pa.array(attrs[a]) for a in table.attrs]
        data = pa.Table.from_arrays(columns, schema=table.handle.schema)
        record()
        with table.lock.write():
            held = table.held_ids()
            new = [i for i in ids.tolist() if i not in held]
            if len(new) == len(ids):
                table.handle.add(data)
            else:
                table.handle.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(data)
            held.update(new)
            table.rows = table.row_count() + len(new)
            table.writes += 1
            if self.compact_every and table.writes >= self.compact_every:
                self._compact(table)

    @lance_errors
    def search(self, name, queries, k=None, where=None) -> Hits:
        table = self._table(name)
        queries = check_vectors(name, queries, table.dim)
        m = len(queries)
        check_where(name, where, table.attrs)
        condition = sql(where)
        record(1, m)
        with table.lock.read():
            rows = table.row_count()
            limit = rows if k is None else min(k, rows)
            if limit == 0 or m == 0:
                return Hits(np.zeros((m, 0), np.int64), np.zeros((m, 0)))
            query = table.handle.search(list(queries) if m > 1 else queries[0], vector_column_name="vector")
            query = query.distance_type(DISTANCE[table.metric]).bypass_vector_index()
            if condition:
                query = query.where(condition, prefilter=True)
            result = query.select(["id", "_distance"]).limit(limit).to_arrow()
        ids = result["id"].to_numpy()
        dists = result["_distance"].to_numpy().astype(np.float64)
        if table.metric == "ip":
            dists -= 1.0  # LanceDB's dot distance is 1 - x.y
        if m > 1:  # rows come grouped by query; make sure of it
            order = np.argsort(result["query_index"].to_numpy(), kind="stable")
            ids, dists = ids[order], dists[order]
        n = len(ids) // m
        return Hits(ids.reshape(m, n), dists.reshape(m, n))

    def search_many(self, searches: Sequence[Search]) -> list[Hits]:
        if len(searches) > 1 and len({s.collection for s in searches}) == 1 \
                and all(s.k is None and s.where is not None for s in searches):
            return self._search_union(searches)
        calls = [lambda s=s: self.search(s.collection, s.queries, s.k, s.where) for s in searches]
        return parallel(calls) if self.concurrent else [c() for c in calls]

    @lance_errors
    def _search_union(self, searches: Sequence[Search]) -> list[Hits]:
        """Filtered all-row searches of one table (a layer's heads) as one query: every query
        vector against the union of the filters, then each search keeps its own matches."""
        table = self._table(searches[0].collection)
        queries = [check_vectors(s.collection, s.queries, table.dim) for s in searches]
        for s in searches:
            check_where(s.collection, s.where, table.attrs)
        union = " OR ".join(f"({sql(s.where)})" for s in searches)
        columns = sorted(set().union(*(s.where.attributes() for s in searches)))
        stacked = np.vstack(queries)
        record(1, len(stacked))
        with table.lock.read():
            query = table.handle.search(list(stacked), vector_column_name="vector")
            query = query.distance_type(DISTANCE[table.metric]).bypass_vector_index().where(union, prefilter=True)
            result = query.select(["id", "_distance", *columns]).limit(max(table.row_count(), 1)).to_arrow()
        order = np.argsort(result["query_index"].to_numpy(), kind="stable")
        which = result["query_index"].to_numpy()[order]
        ids, dists = result["id"].to_numpy()[order], result["_distance"].to_numpy().astype(np.float64)[order]
        if table.metric == "ip":
            dists -= 1.0  # LanceDB's dot distance is 1 - x.y
        attrs = {c: result[c].to_numpy()[order] for c in columns}
        out, first = [], 0
        for s, q in zip(searches, queries):
            keep = s.where.mask(attrs, len(ids)) & (which >= first) & (which < first + len(q))
            n = int(keep.sum()) // max(len(q), 1)
            out.append(Hits(ids[keep].reshape(len(q), n), dists[keep].reshape(len(q), n)))
            first += len(q)
        return out

    @lance_errors
    def fetch(self, name, ids) -> np.ndarray:
        table = self._table(name)
        ids = np.asarray(ids, np.int64)
        record()
        if len(ids) == 0:
            return np.zeros((0, table.dim), np.float32)
        wanted = np.unique(ids)
        with table.lock.read():
            result = table.handle.search().where(f"id IN ({', '.join(map(str, wanted.tolist()))})") \
                .select(["id", "vector"]).limit(len(wanted)).to_arrow()
        got = result["id"].to_numpy()
        vectors = result["vector"].combine_chunks().flatten().to_numpy().reshape(len(got), table.dim)
        order = np.argsort(got)
        got, vectors = got[order], vectors[order]
        check_found(name, ids, set(got.tolist()))
        return vectors[np.searchsorted(got, ids)].astype(np.float32)

    @lance_errors
    def count(self, name) -> int:
        table = self._table(name)
        with table.lock.read():
            return table.row_count()

    @lance_errors
    def drop(self, name) -> None:
        with self._lock:
            self._tables.pop(name, None)
        self.db.drop_table(name, ignore_missing=True)

    @lance_errors
    def collections(self) -> list[str]:
        names, token = [], None
        while True:
            page = self.db.list_tables(page_token=token)
            names += page.tables
            token = page.page_token
            if not token or not page.tables:
                return sorted(set(names))

    @lance_errors
    def stats(self) -> dict:
        out = {}
        for name in self.collections():
            table = self._table(name)
            with table.lock.read():
                s = table.handle.stats()
            out[name] = {"documents": int(s["num_rows"]), "bytes": int(s["total_bytes"]),
                         "fragments": int(s["fragment_stats"]["num_fragments"]), "version": table.handle.version}
        return out

    # maintenance
    @lance_errors
    def compact(self, name: str | None = None) -> None:
        """Compact one table (or every table written since its last compaction) and drop old versions."""
        tables = [self._table(name)] if name else [t for t in list(self._tables.values()) if t.writes]
        for table in tables:
            with table.lock.write():
                self._compact(table)

    def _compact(self, table: Table) -> None:  # the caller holds table.lock.write()
        with warnings.catch_warnings():  # "a concurrent reader would fail": none can, we hold the write lock
            warnings.simplefilter("ignore")
            table.handle.optimize(cleanup_older_than=timedelta(0), delete_unverified=True)
            if table.row_count() >= self.index_rows:  # bitmaps, so a filter reads only the rows it keeps
                for attr in [a for a in self.index_attrs if a in table.attrs and a not in table.indexed]:
                    table.handle.create_index(attr, config=Bitmap())
                    table.indexed.add(attr)
        table.writes = 0

    # persistence
    def flush(self) -> None:
        self.compact()  # the end of a load: one fragment per table, no old versions

    def close(self) -> None:
        with self._lock:
            self._tables.clear()

    def _open(self, name: str) -> Table | None:
        table = self._tables.get(name)
        if table is not None:
            return table
        with self._lock:
            if name not in self._tables:
                try:
                    handle = self.db.open_table(name)
                except (FileNotFoundError, ValueError):
                    return None
                self._tables[name] = Table(handle)
            return self._tables[name]

    def _table(self, name: str) -> Table:
        table = self._open(name)
        if table is None:
            raise no_collection(f"lancedb store at {self.path}", name)
        return table


def connect(path: str | None = None, compact_every: int = 12, concurrent: bool = True,
            index_attrs: Sequence[str] = ("layer", "head"), index_rows: int = 2048) -> LanceStore:
    """path: the store's folder; compact_every: writes to a table between compactions (0: never,
    except at the end of a load); concurrent: let the engine send a round's requests from threads;
    index_attrs: attributes given a bitmap index when a table of index_rows rows or more is compacted."""
    return LanceStore(path, compact_every, concurrent, index_attrs, index_rows)
