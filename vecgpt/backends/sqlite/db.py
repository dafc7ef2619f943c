"""One SQLite database with sqlite-vec loaded: the driver (apsw, else a sqlite3 that can load extensions), its
settings, its transactions, and SQLite's errors as one line each."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path

import sqlite_vec

from vecgpt.backends.base import first_line
from vecgpt.errors import VecgptError

try:  # pyenv's and some distributions' sqlite3 cannot load extensions; apsw always can
    import apsw
except ImportError:
    apsw = None

INSTALL = "pip install 'vecgpt[sqlite]' (apsw), or use a Python whose sqlite3 can load extensions"
MMAP_BYTES = 1 << 40  # read the file through mmap (SQLite caps it at its own limit): a search copies no pages
CACHE_KIB = 65536  # pages not yet in the file (WAL) are read through the page cache


def open_connection(path: Path, timeout: float):
    """A connection with sqlite-vec loaded, waiting up to `timeout` seconds for another process's lock."""
    if apsw is not None:
        conn = apsw.Connection(str(path))
        conn.setbusytimeout(int(timeout * 1000))
        conn.enable_load_extension(True)
        conn.load_extension(sqlite_vec.loadable_path())
        return conn
    conn = sqlite3.connect(str(path), timeout=timeout, isolation_level=None, check_same_thread=False)
    if not hasattr(conn, "enable_load_extension"):
        conn.close()
        raise VecgptError(f"this Python's sqlite3 cannot load extensions (sqlite-vec): {INSTALL}")
    conn.enable_load_extension(True)
    sqlite_vec.load(conn)
    conn.enable_load_extension(False)
    return conn


ERRORS = (apsw.Error, sqlite3.Error) if apsw is not None else (sqlite3.Error,)
BUSY = (apsw.BusyError, apsw.LockedError) if apsw is not None else ()


def busy(e: BaseException) -> bool:
    return isinstance(e, BUSY) or (isinstance(e, sqlite3.OperationalError) and "locked" in str(e))


class Db:
    """The store's connection: statements run one at a time (a lock), transactions BEGIN IMMEDIATE ... COMMIT."""

    def __init__(self, path: Path, timeout: float):
        self.path, self.timeout = path, timeout
        self.lock = threading.RLock()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.conn = open_connection(path, timeout)
        except OSError as e:
            raise VecgptError(f"sqlite: cannot open {path}: {first_line(e)}") from None
        except ERRORS as e:
            raise self.error(e, "open") from None
        self.run(lambda: self._settings())

    def _settings(self) -> None:
        if self.conn.execute("PRAGMA journal_mode").fetchall()[0][0].lower() != "wal":
            self.conn.execute("PRAGMA journal_mode=WAL")  # readers never wait for a writer, nor a writer for them
        self.conn.execute("PRAGMA synchronous=NORMAL")  # a commit survives kill -9 (not a power cut)
        self.conn.execute(f"PRAGMA mmap_size={MMAP_BYTES}")
        self.conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")

    def error(self, e: BaseException, doing: str) -> VecgptError:
        if busy(e):
            return VecgptError(
                f"sqlite store {self.path} is locked by another process (still after {self.timeout:g} s); "
                f"wait for it to finish, or raise [store] timeout"
            )
        if "extension" in str(e).lower() or type(e).__name__ == "ExtensionLoadingError":
            return VecgptError(
                f"sqlite: cannot load sqlite-vec ({first_line(e)}); pip install --force-reinstall sqlite-vec"
            )
        return VecgptError(f"sqlite store {self.path}: {doing} failed ({type(e).__name__}: {first_line(e)[:200]})")

    def run(self, call, doing: str = "a statement"):
        with self.lock:
            try:
                return call()
            except ERRORS as e:
                raise self.error(e, doing) from None

    def rows(self, sql: str, params=()) -> list[tuple]:
        return self.run(lambda: self.conn.execute(sql, params).fetchall(), sql.split(" ", 1)[0].lower())

    @contextmanager
    def transaction(self, doing: str = "a write"):
        """Statements committed together, or none of them; the write lock is taken at BEGIN."""
        with self.lock:
            try:
                self.conn.execute("BEGIN IMMEDIATE")
            except ERRORS as e:
                raise self.error(e, doing) from None
            try:
                yield self.conn
            except BaseException as e:
                self._rollback()
                if isinstance(e, ERRORS):
                    raise self.error(e, doing) from None
                raise
            try:
                self.conn.execute("COMMIT")
            except ERRORS as e:
                self._rollback()
                raise self.error(e, doing) from None

    def _rollback(self) -> None:
        try:
            self.conn.execute("ROLLBACK")
        except ERRORS:  # none open: SQLite rolled back itself
            pass

    def close(self) -> None:
        with self.lock:
            self.conn.close()


def quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
