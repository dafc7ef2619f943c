"""The DuckDB store: one file, a table per collection, every search one statement over Arrow."""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from vecgpt.backends import base
from vecgpt.backends._text_log import Rows, last_rows
from vecgpt.backends.base import Metric, record
from vecgpt.backends.duckdb.records import CATALOG, Records, duck_errors
from vecgpt.backends.duckdb.searching import Searching
from vecgpt.backends.duckdb.statements import (
    RESERVED,
    Meta,
    fixed,
    floats,
    quote,
    table_name,
)
from vecgpt.errors import VecgptError
from vecgpt.paths import expand

MAX_DIM = 100_000  # DuckDB's largest ARRAY


def open_file(path: Path, threads: int) -> duckdb.DuckDBPyConnection:
    """A connection to the store's file; another process holding it is one line saying what to do."""
    if path.is_dir():
        raise VecgptError(f"duckdb: {path} is a folder; [store] path names the store's file, e.g. {path}/vecgpt.duckdb")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        con = duckdb.connect(str(path))  # threads are set below: a config here must match every other connection's
    except duckdb.IOException as e:
        pid = re.search(r"PID (\d+)", str(e))
        if "lock" not in str(e):
            raise VecgptError(
                f"duckdb cannot open {path}: {base.first_line(e)}; move it away or give another [store] path"
            ) from None
        raise VecgptError(
            f"duckdb store {path} is open in another process{f' (PID {pid[1]})' if pid else ''}: DuckDB lets one "
            "process at a time use a file; close it there, or give this one another [store] path"
        ) from None
    except duckdb.Error as e:
        raise VecgptError(f"duckdb cannot open {path}: {base.first_line(e)}") from None
    # Vectors stored as they are: DuckDB's float compression (ALP) costs more to scan than it saves (docs/duckdb.md).
    con.execute("SET force_compression = 'uncompressed'")
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    return con


@base.closes_after_calls
class DuckStore(Searching, Records):
    metrics: tuple[Metric, ...] = ("l2", "ip")
    backend = "duckdb"
    local = True  # reading a manifest costs no request
    groups = True  # a grouped search (a layer's heads) is one statement, its queries joined to their rows

    def __init__(self, path: str | None = None, threads: int = 0):
        self.path = (expand(path) if path else base.cache_dir("duckdb") / "vecgpt.duckdb").absolute()
        self.con = open_file(self.path, threads)
        self._lock = threading.RLock()
        self._meta: dict[str, Meta] = {}
        for statement in CATALOG:
            self.con.execute(statement)

    def __str__(self) -> str:
        return f"DuckStore(path={self.path})"

    def _sql(self, text: str, params: list | None = None) -> list[tuple]:
        with self._lock:
            return self.con.execute(text, params).fetchall()

    @contextmanager
    def _transaction(self):
        with self._lock:
            self.con.execute("BEGIN TRANSACTION")
            try:
                yield
            except BaseException:
                self.con.execute("ROLLBACK")
                raise
            self.con.execute("COMMIT")

    @contextmanager
    def _registered(self, name: str, table: pa.Table):
        """An Arrow table a statement reads by name (scanned in place, not copied). Left registered until the next
        one of that name replaces it: unregistering would cost as much again (0.3 ms, a fifth of a small search)."""
        self.con.register(name, table)
        yield

    def _get(self, name: str) -> Meta | None:
        if name not in self._meta:
            rows = self._sql("SELECT tbl, dim, metric, attrs, payload FROM vecgpt_collections WHERE name = ?", [name])
            if not rows:
                return None
            self._meta[name] = Meta(*rows[0][:3], list(rows[0][3]), rows[0][4])
        return self._meta[name]

    def _col(self, name: str) -> Meta:
        return base.existing(self._get(name), self, name)

    def close(self) -> None:
        with self._lock:
            self.con.close()  # a second close does nothing

    # collections
    @duck_errors
    def create(self, name: str, dim: int, metric: Metric, attrs: Sequence[str] = (), payload: int = 0) -> None:
        base.check_metric(self.backend, metric, self.metrics)
        meta = self._get(name)
        if meta is not None:
            base.check_same(name, (meta.dim, meta.metric, meta.payload), dim, metric, payload)
            return
        check_shape(dim, payload, attrs)
        meta = Meta(table_name(name), int(dim), metric, list(attrs), int(payload))
        with self._transaction():
            self._sql(f"CREATE TABLE {quote(meta.table)} ({meta.columns()})")
            self._register(name, meta)

    def _register(self, name: str, meta: Meta) -> None:
        self._sql(
            "INSERT INTO vecgpt_collections VALUES (?, ?, ?, ?, ?, ?)",
            [name, meta.table, meta.dim, meta.metric, meta.attrs, meta.payload],
        )
        self._meta[name] = meta

    @duck_errors
    def clone(self, src: str, dst: str) -> None:
        """dst: a new table holding every row of src, copied by DuckDB in one statement."""
        meta = self._col(src)
        if self._get(dst) is not None:
            raise VecgptError(f"cannot clone {src!r} to {dst!r}: {dst!r} exists; drop it first")
        new = Meta(table_name(dst), meta.dim, meta.metric, meta.attrs, meta.payload)
        record()
        with self._transaction():
            self._sql(f"CREATE TABLE {quote(new.table)} AS SELECT * FROM {quote(meta.table)}")
            self._register(dst, new)

    @duck_errors
    def drop(self, name: str) -> None:
        meta = self._get(name)
        if meta is None:
            return
        with self._transaction():
            self._sql(f"DROP TABLE IF EXISTS {quote(meta.table)}")
            self._sql("DELETE FROM vecgpt_collections WHERE name = ?", [name])
        self._meta.pop(name, None)

    @duck_errors
    def collections(self) -> list[str]:
        return [r[0] for r in self._sql("SELECT name FROM vecgpt_collections ORDER BY name")]

    @duck_errors
    def count(self, name: str) -> int:
        return self._sql(f"SELECT count(*) FROM {quote(self._col(name).table)}")[0][0]

    @duck_errors
    def stats(self) -> dict:
        """Documents, and the bytes their columns hold as stored (uncompressed: 8 an integer, 4 a float)."""
        out = {}
        for name in self.collections():
            meta, n = self._col(name), self.count(name)
            row = 8 * (1 + len(meta.attrs)) + 4 * (meta.dim + meta.payload)
            out[name] = {"documents": n, "bytes": n * row}
        return out

    # rows
    @duck_errors
    def upsert(self, name, ids, vectors, attrs=None, payload=None) -> None:
        meta = self._col(name)
        ids, vectors = base.check_rows(name, ids, vectors, meta.dim)
        payload = base.check_payload(name, payload, len(ids), meta.payload)
        if len(ids) == 0:
            return
        ids, vectors, attrs, payload = last_rows(name, Rows(ids, vectors, attrs or {}, payload), meta.attrs)
        columns = [pa.array(ids), *(pa.array(attrs[a]) for a in meta.attrs), fixed(vectors)]
        rows = pa.Table.from_arrays(columns + ([fixed(payload)] if meta.payload else []), schema=meta.schema())
        table = quote(meta.table)
        record()
        with self._registered("vecgpt_rows", rows), self._transaction():
            self._sql(f"DELETE FROM {table} WHERE id IN (SELECT id FROM vecgpt_rows)")
            self._sql(f"INSERT INTO {table} SELECT * FROM vecgpt_rows")

    @duck_errors
    def fetch(self, name, ids, payload=False):
        meta = self._col(name)
        want = np.asarray(ids, np.int64)
        columns = "w.id, w.v" + (", w.payload" if payload and meta.payload else "")
        record()
        with self._registered("vecgpt_ids", pa.table({"id": np.unique(want)})):
            text = f"SELECT {columns} FROM {quote(meta.table)} w SEMI JOIN vecgpt_ids x ON w.id = x.id"
            result = self.con.sql(text).to_arrow_table()
        at = base.positions(name, result["id"].to_numpy(), want)
        vectors = floats(result["v"], meta.dim)[at]
        if not payload:
            return vectors
        if not meta.payload:
            return vectors, np.zeros((len(want), 0), np.float32)
        return vectors, floats(result["payload"], meta.payload)[at]


def check_shape(dim: int, payload: int, attrs: Sequence[str]) -> None:
    if not 1 <= dim <= MAX_DIM or not 0 <= payload <= MAX_DIM:
        raise VecgptError(
            f"duckdb holds vectors of dimension 1 to {MAX_DIM} (payloads up to {MAX_DIM}), not {dim} ({payload})"
        )
    bad = [a for a in attrs if a.lower() in RESERVED]
    if bad:
        raise VecgptError(f"attribute name {bad[0]!r} is reserved ({', '.join(sorted(RESERVED))})")
