"""A Lance table as the store sees it, the lock that keeps compactions from searches, and filters as SQL."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import threading
from contextlib import contextmanager, suppress

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lancedb.background_loop import LOOP

from vecgpt.backends.base import Metric, Where

DISTANCE = {"l2": "l2", "ip": "dot"}  # LanceDB's names
RESERVED = {"id", "vector", "payload"}  # the columns a table may have beside its attributes
FLAT_INDEX = "vecgpt_flat"  # the name of a table's IVF_FLAT index of one partition (LanceStore._compact)


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
        indices = handle.list_indices()
        self.indexed = {c for index in indices for c in index.columns}
        self.flat = any(index.name == FLAT_INDEX for index in indices)  # only one partition: searched, it is exact
        self.rowids: tuple[np.uint64, np.ndarray] | None = None  # first _rowid, ids by _rowid; None after a write

    def changed(self) -> None:
        """The table was written or compacted (under its write lock): rows may have new _rowids."""
        self.rowids = None

    def latest(self) -> None:
        """Move to the table's newest version, forgetting what this process knew of the older one."""
        with self.lock.write():
            self.handle.checkout_latest()
            self.ids, self.rows = None, None
            self.changed()

    def row_count(self) -> int:
        if self.rows is None:
            self.rows = self.handle.count_rows()
        return self.rows

    async def nearest(self, vectors: np.ndarray, columns: list[str], limit: int, where: str | None = None, upper=None):
        """An exact search by the table's metric (a flat scan, or the store's index of one partition, which scores
        every row; never another index), run on LanceDB's event loop: pa.Table of _rowid, _distance, `columns`
        and (two or more vectors) query_index. upper: only rows whose _distance is below it (a radius search)."""
        # An unfiltered search of a table with the store's index reads it: one partition, so every row is scored,
        # from vectors LanceDB keeps in memory, faster than a scan of the table's files (docs/lancedb.md).
        # Otherwise two or more vectors take LanceDB's batched flat search, which keeps each query's nearest as it
        # scans; one vector takes a TopK that copies the vector of every row it keeps, so a lone query for every
        # row is sent twice (the same distances: one kernel) and its copy dropped.
        indexed = self.flat and where is None
        twice = not indexed and len(vectors) == 1 and limit >= self.rows  # counted by the caller: no sync call here
        query = self.query() if where is None else self.query().where(where)
        query = query.nearest_to(np.vstack([vectors, vectors]) if twice else vectors)  # rows: one query each
        query = query.column("vector").distance_type(DISTANCE[self.metric])
        query = query if upper is None else query.distance_range(None, upper)
        query = query.nprobes(1) if indexed else query.bypass_vector_index()
        result = await collect(query.select(columns).with_row_id().limit(limit))
        return result.filter(pc.equal(result["query_index"], 0)).drop_columns("query_index") if twice else result

    def ids_of(self, result: pa.Table) -> np.ndarray:
        """The ids of a search's rows: read with them, or (rowids known) looked up by their _rowid."""
        if "id" in result.column_names:
            return result["id"].to_numpy()
        first, ids = self.rowids
        at = result["_rowid"].to_numpy() - first
        if len(at) and at.max() >= len(ids):  # cannot be while this version is searched; never a wrong id
            raise RuntimeError("a search returned a row this process did not know of")
        return ids[at]

    def knows_rowids(self, result: pa.Table, every_row: bool) -> None:
        """Learn _rowid -> id from a search that returned every row (no filter), if the _rowids are one range (a
        compacted table's one fragment): later searches of this version of the table read only _rowid and
        _distance, not the ids (a second read of the table, by _rowid, saved)."""
        if not every_row or self.rowids is not None or len(result) == 0:
            return
        if "query_index" in result.column_names:
            result = result.filter(pc.equal(result["query_index"], 0))
        rowids = result["_rowid"].to_numpy()
        first = int(rowids.min())
        if int(rowids.max()) - first == len(rowids) - 1:
            ids = np.empty(len(rowids), np.int64)
            ids[rowids - first] = result["id"].to_numpy()
            self.rowids = np.uint64(first), ids

    def scan(self, columns: list[str], limit: int, where: str | None = None):
        """The rows matching `where`: pa.Table."""
        return run(self.query() if where is None else self.query().where(where), columns, limit)

    def query(self):
        # LanceDB's asynchronous table under the synchronous one: its query is one hop to LanceDB's
        # event loop, where the synchronous builder makes four (three reads of the schema, then the
        # query), and a token sends dozens of queries (docs/lancedb.md). Filters prefilter.
        return self.handle._table.query()

    def distances(self, result) -> np.ndarray:
        """The protocol's distances from LanceDB's float32 `_distance`: its dot distance is 1 - x.y."""
        dists = result["_distance"].to_numpy().astype(np.float64)
        return dists - 1.0 if self.metric == "ip" else dists

    def distance_of(self, d: np.float32) -> float:
        """The protocol's distance of one `_distance` d, as `distances` gives it."""
        return float(d) - 1.0 if self.metric == "ip" else float(d)

    def held_ids(self) -> set[int]:
        if self.ids is None:
            rows = self.row_count()
            arrow = self.handle.search().select(["id"]).limit(rows).to_arrow() if rows else None
            self.ids = set(arrow["id"].to_numpy().tolist()) if arrow is not None else set()
        return self.ids


def run(query, columns: list[str], limit: int):
    return on_this_thread(collect(query.select(columns).limit(limit)))


class OwnLoop:
    """An event loop of one thread's own, closed when the thread ends."""

    def __init__(self):
        self.pid, self.loop = os.getpid(), asyncio.new_event_loop()

    def run(self, coroutine):
        try:
            return self.loop.run_until_complete(coroutine)
        except BaseException:
            self.settle()
            raise

    SETTLE_S = 2.0

    def settle(self) -> None:
        """After a query was cut short (a Ctrl-C raised inside one of a round's searches): cancel what it left on the
        loop and let every task's outcome be taken, which asyncio would print, traceback and all, when the task is
        collected (asyncio.Runner does this on the way in instead, for every query). A task still running SETTLE_S
        after it was cancelled is left behind: LanceDB's answer to a cancelled query can fail to come (rarely), and
        the reader would then wait here for good instead of exiting."""
        tasks = asyncio.all_tasks(self.loop)
        for task in tasks:
            task.cancel()
        if tasks:
            with suppress(BaseException):
                self.loop.run_until_complete(asyncio.wait(tasks, timeout=self.SETTLE_S))
        for task in tasks:
            if task.done() and not task.cancelled():
                task.exception()  # taken

    def __del__(self):
        if self.pid == os.getpid():  # never in a forked child: the loop's epoll instance is its parent's too
            self.loop.close()


_loops = threading.local()


def on_this_thread(coroutine):
    """Run a query's coroutine on an event loop of the calling thread's own: LanceDB's runtime answers it there,
    one hop each way, where its background loop (a thread of its own) adds a hop each way (docs/lancedb.md). A thread
    already running an event loop uses LanceDB's."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # none: the usual case
        pass
    else:
        return LOOP.run(coroutine)
    own = getattr(_loops, "own", None)
    if own is None or own.pid != os.getpid():
        own = _loops.own = OwnLoop()
    return own.run(coroutine)


ONE_BATCH = 1 << 30  # rows a batch of a query's stream may hold: all of them


async def collect(query) -> pa.Table:
    """A query's rows, read straight from LanceDB's stream (its to_arrow reads the table's schema first,
    another hop to LanceDB's runtime), as one batch: each batch is a hop from LanceDB's runtime to the event loop,
    and by default a batch holds 1,024 rows (c_fc's 3,072 rows would take three hops; docs/lancedb.md)."""
    stream = await query._inner.execute(max_batch_length=ONE_BATCH, timeout=None)
    return pa.Table.from_batches([batch async for batch in stream], stream.schema)


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
    return " AND ".join(terms(where.conditions())) or None


def union(shared: frozenset, own: list[set]) -> str | None:
    """SQL for the rows that any of the filters shared & own[i] keeps (Where.conditions): the shared conditions
    once, then the filters' own, as one IN where each is one equality on the same attribute (a layer's heads:
    cheaper for LanceDB than twelve ORs of whole filters)."""
    parts = terms(shared)
    if own and all(own):  # a filter with no condition of its own keeps every row the shared conditions keep
        names = {name for conditions in own for _, name, _ in conditions}
        if len(names) == 1 and all(len(c) == 1 and next(iter(c))[0] is np.equal for c in own):
            values = sorted({int(value) for conditions in own for *_, value in conditions})
            parts.append(f"{names.pop()} IN ({', '.join(map(str, values))})")
        else:
            parts.append("(" + " OR ".join(f"({' AND '.join(terms(c))})" for c in own) + ")")
    return " AND ".join(parts) or None


OPS = {np.equal: "=", np.less: "<", np.greater_equal: ">="}


def terms(conditions) -> list[str]:
    """Where.conditions as SQL terms, in a fixed order."""
    return sorted(f"{name} {OPS[op]} {int(value)}" for op, name, value in conditions)
