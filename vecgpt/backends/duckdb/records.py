"""The DuckDB store's records in its file: model records (vecgpt_manifests), text records (vecgpt_texts) and the
lock a text is open under.

DuckDB lets one process at a time open a file to write, so a text open in this process is open nowhere else:
its lock is held in this process, shared by every store opened on the same file here.
"""

from __future__ import annotations

import functools
import json
import threading
from contextlib import contextmanager
from pathlib import Path

import duckdb

from vecgpt.backends import base
from vecgpt.errors import VecgptError

CATALOG = (
    "CREATE TABLE IF NOT EXISTS vecgpt_collections (name VARCHAR, tbl VARCHAR, dim INTEGER, metric VARCHAR, "
    "attrs VARCHAR[], payload INTEGER)",
    "CREATE TABLE IF NOT EXISTS vecgpt_manifests (key VARCHAR, value VARCHAR)",
    "CREATE TABLE IF NOT EXISTS vecgpt_texts (id VARCHAR, record VARCHAR, version INTEGER)",
)

INTERRUPTED = "Query interrupted"  # what DuckDB raises (a RuntimeError) when Ctrl-C stops a statement
_open_texts: dict[tuple[Path, str], int] = {}  # (file, text id) -> holders (one at most)
_open_lock = threading.Lock()


def duck_errors(method):
    """A method run under the store's lock (one connection: DuckDB's are not for several threads at once); DuckDB's
    errors as one-line VecgptErrors, and Ctrl-C during a statement as the KeyboardInterrupt it was: DuckDB stops
    the statement and raises RuntimeError("Query interrupted") in its place, which would end the CLI with a
    traceback instead of its one line and exit 130."""

    @functools.wraps(method)
    def wrapped(self, *args, **kw):
        with self._lock:
            try:
                return method(self, *args, **kw)
            except duckdb.InterruptException:
                raise KeyboardInterrupt from None
            except RuntimeError as e:
                if str(e) == INTERRUPTED:
                    raise KeyboardInterrupt from None
                raise
            except duckdb.Error as e:
                self._meta.clear()  # a table changed under this store (another store of this file): read again
                raise VecgptError(
                    f"duckdb store {self.path}: {method.__name__} failed: {base.first_line(e)[:300]}"
                ) from None

    return wrapped


class Records:
    """Mixed into DuckStore, which gives path, _sql (a statement's rows, under the store's lock) and _transaction."""

    path: Path

    @duck_errors
    def read_manifest(self, key: str) -> dict | None:
        rows = self._sql("SELECT value FROM vecgpt_manifests WHERE key = ?", [key])
        return json.loads(rows[0][0]) if rows else None

    @duck_errors
    def write_manifest(self, key: str, manifest: dict | None) -> None:
        value = None if manifest is None else json.dumps(manifest)
        with self._transaction():
            self._sql("DELETE FROM vecgpt_manifests WHERE key = ?", [key])
            if value is not None:
                self._sql("INSERT INTO vecgpt_manifests VALUES (?, ?)", [key, value])
        if value is not None:  # a load is complete: its rows move from the write-ahead log into the file
            self._sql("CHECKPOINT")

    @duck_errors
    def manifests(self) -> list[str]:
        return [r[0] for r in self._sql("SELECT key FROM vecgpt_manifests ORDER BY key")]

    @duck_errors
    def read_text(self, text_id: str) -> dict | None:
        rows = self._sql("SELECT record, version FROM vecgpt_texts WHERE id = ?", [text_id])
        return {**json.loads(rows[0][0]), "version": rows[0][1]} if rows else None

    @duck_errors
    def write_text(self, text_id: str, record: dict | None, expect: int | None) -> int:
        body = None if record is None else json.dumps({k: v for k, v in record.items() if k != "version"})
        with self._transaction():
            rows = self._sql("SELECT version FROM vecgpt_texts WHERE id = ?", [text_id])
            version = base.check_version(text_id, rows[0][0] if rows else None, expect)
            self._sql("DELETE FROM vecgpt_texts WHERE id = ?", [text_id])
            if body is not None:
                self._sql("INSERT INTO vecgpt_texts VALUES (?, ?, ?)", [text_id, body, version])
        return version

    @duck_errors
    def texts(self) -> list[str]:
        return [r[0] for r in self._sql("SELECT id FROM vecgpt_texts ORDER BY id")]

    @contextmanager
    def text_lock(self, text_id: str):
        key = (self.path, text_id)
        with _open_lock:
            if key in _open_texts:
                raise base.text_busy(text_id)
            _open_texts[key] = 1
        try:
            yield
        finally:
            with _open_lock:
                _open_texts.pop(key, None)
