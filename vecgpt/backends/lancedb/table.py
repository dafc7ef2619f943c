"""A Lance table as the store sees it, the lock that keeps compactions from searches, and filters as SQL."""

from __future__ import annotations

import functools
import json
import threading
from contextlib import contextmanager

import numpy as np
import pyarrow as pa
from lancedb.background_loop import LOOP

from vecgpt.backends.base import Metric, Where

DISTANCE = {"l2": "l2", "ip": "dot"}  # LanceDB's names
RESERVED = {"id", "vector", "payload"}  # the columns a table may have beside its attributes


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
        self.width = int(meta.get("vecgpt.payload", 0))  # floats of payload a row; tables made before: none
        self.lock = RWLock()
        self.ids: set[int] | None = None  # the ids held, read on the first upsert
        self.rows: int | None = None  # row count, kept up to date by this process's writes
        self.writes = 0  # writes since the last compaction
        self.indexed = {c for index in handle.list_indices() for c in index.columns}

    def latest(self) -> None:
        """Move to the table's newest version, forgetting what this process knew of the older one."""
        with self.lock.write():
            self.handle.checkout_latest()
            self.ids, self.rows = None, None

    def row_count(self) -> int:
        if self.rows is None:
            self.rows = self.handle.count_rows()
        return self.rows

    def nearest(self, vectors: list | np.ndarray, columns: list[str], limit: int, where: str | None = None):
        """An exact search (a flat scan by the table's metric, whatever index the table has): pa.Table."""
        query = self.query().nearest_to(vectors).column("vector").distance_type(DISTANCE[self.metric])
        query = query.bypass_vector_index()
        return run(query if where is None else query.where(where), columns, limit)

    def scan(self, columns: list[str], limit: int, where: str | None = None):
        """The rows matching `where`: pa.Table."""
        return run(self.query() if where is None else self.query().where(where), columns, limit)

    def query(self):
        # LanceDB's asynchronous table under the synchronous one: its query is one hop to LanceDB's
        # event loop, where the synchronous builder makes four (three reads of the schema, then the
        # query), about 1 ms each on a busy machine, 60 times a token (docs/speed.md). Filters prefilter.
        return self.handle._table.query()

    def distances(self, result) -> np.ndarray:
        """The protocol's distances from LanceDB's float32 `_distance`: its dot distance is 1 - x.y."""
        dists = result["_distance"].to_numpy().astype(np.float64)
        return dists - 1.0 if self.metric == "ip" else dists

    def held_ids(self) -> set[int]:
        if self.ids is None:
            rows = self.row_count()
            arrow = self.handle.search().select(["id"]).limit(rows).to_arrow() if rows else None
            self.ids = set(arrow["id"].to_numpy().tolist()) if arrow is not None else set()
        return self.ids


def run(query, columns: list[str], limit: int):
    return LOOP.run(query.select(columns).limit(limit).to_arrow())


def schema(dim: int, metric: Metric, attrs: list[str], width: int) -> pa.Schema:
    """id, vector, the attributes and (width > 0) the payload, as FixedSizeList<float32>; the rest as metadata."""
    fields = [pa.field("id", pa.int64()), pa.field("vector", pa.list_(pa.float32(), dim))]
    fields += [pa.field(a, pa.int64()) for a in attrs]
    fields += [pa.field("payload", pa.list_(pa.float32(), width))] if width else []
    meta = {"vecgpt.dim": str(dim), "vecgpt.metric": metric, "vecgpt.attrs": json.dumps(attrs)}
    return pa.schema(fields, metadata={**meta, "vecgpt.payload": str(width)})


def floats(column, width: int) -> np.ndarray:
    """A FixedSizeList<float32> column as float32 [n, width]."""
    return column.combine_chunks().flatten().to_numpy().reshape(-1, width)


def fixed(values: np.ndarray) -> pa.FixedSizeListArray:
    """float32 [n, width] as a FixedSizeList<float32> column."""
    return pa.FixedSizeListArray.from_arrays(
        pa.array(np.ascontiguousarray(values, np.float32).ravel()), values.shape[1]
    )


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
    terms = (
        [f"{a} = {int(v)}" for a, v in where.eq.items()]
        + [f"{a} < {int(v)}" for a, v in where.lt.items()]
        + [f"{a} >= {int(v)}" for a, v in where.ge.items()]
    )
    return " AND ".join(terms) or None
