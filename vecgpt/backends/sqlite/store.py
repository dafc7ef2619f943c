"""The SQLite store: one vec0 table per collection in one database file, with the catalog, the models' manifests
and the texts' records in ordinary tables of the same file."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from vecgpt.backends import base
from vecgpt.backends._text_log import Rows, last_rows
from vecgpt.backends.base import Metric, file_lock, record
from vecgpt.backends.sqlite import knn
from vecgpt.backends.sqlite.db import Db, quoted
from vecgpt.backends.sqlite.knn import ID, Table
from vecgpt.backends.sqlite.search import Searching
from vecgpt.errors import VecgptError
from vecgpt.paths import expand

MAX_DIM = 8192  # sqlite-vec's largest vector
MAX_ATTRS = 15  # vec0 holds 16 metadata columns; one is ID
RESERVED = {"id", "rowid", "vector", "payload", "distance", "k", ID}
SUFFIXES = (".db", ".sqlite", ".sqlite3")  # a path ending so is the database file, any other a folder holding one
FILE = "vecgpt.db"
# A text's keys are searched a layer's head at a time: vec0 keeps each (layer, head) in chunks of its own, and a KNN
# filtered on both reads only that head's (one head's keys of 4,800 at 400 positions: 0.4 ms, not 5.4; docs/sqlite.md)
PARTITIONS = ("layer", "head")
PARTITION_CHUNK = 32  # rows a chunk of a partition holds: a short text's 144 heads each fill a chunk of their own
FEW = 4096  # ids a fetch names in one statement
CATALOG = (
    "CREATE TABLE IF NOT EXISTS vecgpt_collections (name TEXT PRIMARY KEY, tbl TEXT NOT NULL, dim INTEGER NOT NULL,"
    " metric TEXT NOT NULL, attrs TEXT NOT NULL, payload INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS vecgpt_manifests (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS vecgpt_texts (id TEXT PRIMARY KEY, record TEXT NOT NULL, version INTEGER NOT NULL)",
)


def database(path: str | None) -> Path:
    """The database file a [store] path names: the file itself, or FILE in the folder."""
    where = expand(path) if path else base.cache_dir("sqlite")
    return where if where.suffix in SUFFIXES or where.is_file() else where / FILE


def table_name(name: str) -> str:
    return "v_" + hashlib.sha1(name.encode()).hexdigest()[:24]


def check_shape(dim: int, attrs: Sequence[str]) -> None:
    if not 1 <= dim <= MAX_DIM:
        raise VecgptError(f"sqlite-vec holds vectors of dimension 1 to {MAX_DIM}, not {dim}; use another store")
    bad = [a for a in attrs if a.lower() in RESERVED or not re.fullmatch(r"[a-z_][a-z0-9_]*", a)]
    if bad or len(attrs) > MAX_ATTRS:
        raise VecgptError(
            f"attributes {list(attrs)}: at most {MAX_ATTRS}, each [a-z_][a-z0-9_]*, none of {sorted(RESERVED)}"
        )


@base.closes_after_calls
class SqliteStore(Searching):
    metrics: tuple[Metric, ...] = ("l2",)  # vec0 has no inner product
    backend = "sqlite"
    local = True  # reading a manifest costs no request
    concurrent = True  # a connection per thread: a round's searches run at once (docs/sqlite.md)

    def __init__(self, path: str | None = None, timeout: float = 5.0, chunk_size: int = 128, threads: int = 1):
        self.file = database(path)
        self.chunk_size, self.threads = chunk_size, threads
        self._sizes: dict[str, tuple[int, int, int]] = {}  # a model table's rows and id span, as first read
        self.db = Db(self.file, timeout)
        self.locks = self.file.with_name(self.file.name + ".locks")  # flock files: loads, open texts
        if len(self.db.rows("SELECT name FROM sqlite_master WHERE name LIKE 'vecgpt_%'")) < len(CATALOG):
            with self.db.transaction("making the catalog") as conn:
                for statement in CATALOG:
                    conn.execute(statement)

    def __str__(self) -> str:
        return f"SqliteStore(path={self.file})"

    def _get(self, name: str) -> Table | None:
        rows = self.db.rows("SELECT tbl, dim, metric, attrs, payload FROM vecgpt_collections WHERE name = ?", (name,))
        if not rows:
            return None
        tbl, dim, metric, attrs, payload = rows[0]
        return Table(tbl, dim, metric, json.loads(attrs), payload)

    def _table(self, name: str) -> Table:
        return base.existing(self._get(name), self, name)

    # collections
    def create(self, name: str, dim: int, metric: Metric, attrs: Sequence[str] = (), payload: int = 0) -> None:
        base.check_metric(self.backend, metric, self.metrics)
        held = self._get(name)
        if held is not None:
            base.check_same(name, (held.dim, held.metric, held.payload), dim, metric, payload)
            return
        check_shape(int(dim), attrs)
        table = Table(table_name(name), int(dim), metric, list(attrs), int(payload))
        columns = [f"vector float[{table.dim}] distance_metric=l2", f"{ID} integer"]
        columns += [f"{a} integer" + (" partition key" if a in PARTITIONS else "") for a in table.attrs]
        chunk = PARTITION_CHUNK if set(table.attrs) & set(PARTITIONS) else self.chunk_size
        columns += ["+payload blob", f"chunk_size={chunk}"]  # vec0 parses no quoted names
        with self.db.transaction(f"creating {name!r}") as conn:
            conn.execute(
                f"CREATE VIRTUAL TABLE {quoted(table.name)} USING vec0(id integer primary key, {', '.join(columns)})"
            )
            conn.execute(
                "INSERT INTO vecgpt_collections VALUES (?, ?, ?, ?, ?, ?)",
                (name, table.name, table.dim, metric, json.dumps(table.attrs), table.payload),
            )

    def clone(self, src: str, dst: str) -> None:
        """dst: a new collection holding every row of src, copied by SQLite in one transaction."""
        table = self._table(src)
        if self._get(dst) is not None:
            raise VecgptError(f"cannot clone {src!r} to {dst!r}: {dst!r} exists; drop it first")
        self.create(dst, table.dim, table.metric, table.attrs, table.payload)
        columns = ", ".join(["id", "vector", ID, *map(quoted, table.attrs), "payload"])
        record()
        with self.db.transaction(f"cloning {src!r}") as conn:
            conn.execute(
                f"INSERT INTO {quoted(table_name(dst))} ({columns}) SELECT {columns} FROM {quoted(table.name)}"
            )

    def drop(self, name: str) -> None:
        self._sizes.pop(name, None)
        table = self._get(name)
        if table is None:
            return
        with self.db.transaction(f"dropping {name!r}") as conn:
            conn.execute(f"DROP TABLE IF EXISTS {quoted(table.name)}")
            conn.execute("DELETE FROM vecgpt_collections WHERE name = ?", (name,))

    def collections(self) -> list[str]:
        return [r[0] for r in self.db.rows("SELECT name FROM vecgpt_collections ORDER BY name")]

    def count(self, name: str) -> int:
        return self.db.rows(f"SELECT count(*) FROM {quoted(self._table(name).name)}")[0][0]

    def stats(self) -> dict:
        out = {}
        for name in self.collections():
            table = self._table(name)
            try:  # dbstat: where SQLite was built with it (apsw's is)
                size = self.db.rows(
                    "SELECT sum(pgsize) FROM dbstat WHERE name = ? OR name GLOB ?", (table.name, f"{table.name}_*")
                )
            except VecgptError:
                size = [(None,)]
            out[name] = {"documents": self.count(name), "bytes": size[0][0] or 0}
        return out

    # rows
    def upsert(self, name, ids, vectors, attrs=None, payload=None) -> None:
        table = self._table(name)
        ids, vectors = base.check_rows(name, ids, vectors, table.dim)
        payload = base.check_payload(name, payload, len(ids), table.payload)
        if len(ids) == 0:
            return
        self._sizes.pop(name, None)
        ids, vectors, attrs, payload = last_rows(name, Rows(ids, vectors, attrs or {}, payload), table.attrs)
        columns = ", ".join(["id", "vector", ID, *map(quoted, table.attrs), "payload"])
        marks = ", ".join("?" * (4 + len(table.attrs)))
        values = [ids.tolist(), list(vectors), ids.tolist(), *(attrs[a].tolist() for a in table.attrs), list(payload)]
        rows = [(i, v.tobytes(), j, *rest[:-1], rest[-1].tobytes()) for i, v, j, *rest in zip(*values)]
        record()
        with self.db.transaction(f"writing {name!r}") as conn:  # vec0 replaces no row: a written id goes first
            conn.executemany(f"DELETE FROM {quoted(table.name)} WHERE id = ?", [(i,) for i in ids.tolist()])
            conn.executemany(f"INSERT INTO {quoted(table.name)} ({columns}) VALUES ({marks})", rows)

    def fetch(self, name: str, ids: np.ndarray, payload: bool = False):
        table = self._table(name)
        want = np.asarray(ids, np.int64)
        wanted = np.unique(want)
        record()
        rows = []
        for start in range(0, len(wanted), FEW):
            chunk = ", ".join(map(str, wanted[start : start + FEW].tolist()))
            rows += self.db.rows(f"SELECT id, vector, payload FROM {quoted(table.name)} WHERE id IN ({chunk})")
        got = np.fromiter((r[0] for r in rows), np.int64, len(rows))
        vectors, values = [r[1] for r in rows], [r[2] for r in rows]
        order = np.argsort(got)
        got = got[order]
        base.check_found(name, want[~np.isin(want, got)], ())
        at = order[np.searchsorted(got, want)]
        found = knn.floats(vectors, table.dim)[at] if vectors else np.zeros((0, table.dim), np.float32)
        if not payload:
            return found
        held = knn.floats([p or bytes(4 * table.payload) for p in values], table.payload) if values else None
        return found, held[at] if held is not None else np.zeros((0, table.payload), np.float32)

    # models and texts
    def read_manifest(self, key: str) -> dict | None:
        rows = self.db.rows("SELECT value FROM vecgpt_manifests WHERE key = ?", (key,))
        return json.loads(rows[0][0]) if rows else None

    def write_manifest(self, key: str, manifest: dict | None) -> None:
        value = None if manifest is None else json.dumps(manifest)
        with self.db.transaction("writing a manifest") as conn:
            conn.execute("DELETE FROM vecgpt_manifests WHERE key = ?", (key,))
            if value is not None:
                conn.execute("INSERT INTO vecgpt_manifests VALUES (?, ?)", (key, value))

    def manifests(self) -> list[str]:
        return [r[0] for r in self.db.rows("SELECT key FROM vecgpt_manifests ORDER BY key")]

    def read_text(self, text_id: str) -> dict | None:
        rows = self.db.rows("SELECT record, version FROM vecgpt_texts WHERE id = ?", (text_id,))
        return {**json.loads(rows[0][0]), "version": rows[0][1]} if rows else None

    def write_text(self, text_id: str, record: dict | None, expect: int | None) -> int:
        body = None if record is None else json.dumps({k: v for k, v in record.items() if k != "version"})
        with self.db.transaction("writing a text") as conn:  # BEGIN IMMEDIATE: no other writer until COMMIT
            held = conn.execute("SELECT version FROM vecgpt_texts WHERE id = ?", (text_id,)).fetchall()
            version = base.check_version(text_id, held[0][0] if held else None, expect)
            conn.execute("DELETE FROM vecgpt_texts WHERE id = ?", (text_id,))
            if body is not None:
                conn.execute("INSERT INTO vecgpt_texts VALUES (?, ?, ?)", (text_id, body, version))
        return version

    def texts(self) -> list[str]:
        return [r[0] for r in self.db.rows("SELECT id FROM vecgpt_texts ORDER BY id")]

    @contextmanager
    def text_lock(self, text_id: str):
        with file_lock(self.locks / f"{text_id}.open", wait=False, busy=base.text_busy(text_id)):
            yield

    def load_lock(self):
        return file_lock(self.locks / "load.lock")

    def close(self) -> None:
        self.db.close()
