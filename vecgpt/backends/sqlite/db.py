"""One SQLite database with sqlite-vec loaded: the driver (apsw, else a sqlite3 that can load extensions), its
settings, its transactions, and SQLite's errors as one line each."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
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


DAMAGED = ("CorruptError", "NotADBError")  # apsw's; sqlite3 says "malformed" or "not a database"


def damaged(e: BaseException) -> bool:
    return isinstance(e, sqlite3.DatabaseError) and ("malformed" in str(e) or "not a database" in str(e))


def busy(e: BaseException) -> bool:
    return isinstance(e, BUSY) or (isinstance(e, sqlite3.OperationalError) and "locked" in str(e))


class Db:
    """The store's database: a connection for each thread that uses it (SQLite runs one statement at a time on a
    connection; in WAL mode, connections read at once, and read while one writes), transactions BEGIN IMMEDIATE."""

    def __init__(self, path: Path, timeout: float):
        self.path, self.timeout = path, timeout
        self.lock = threading.Lock()  # guards opened
        self.opened: list = []  # every thread's connection, closed together
        self.local, self.pid = threading.local(), os.getpid()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise VecgptError(f"sqlite: cannot make {path.parent}: {first_line(e)}") from None
        self.conn  # noqa: B018 (opened here: a bad path or driver fails at connect)

    @property
    def conn(self):
        """This thread's connection, opened when it first asks."""
        conn = getattr(self.local, "conn", None)
        if conn is None or self.pid != os.getpid():  # a forked child uses none of its parent's connections
            if self.pid != os.getpid():
                self.pid, self.local, self.opened = os.getpid(), threading.local(), []
            try:
                conn = open_connection(self.path, self.timeout)
                settings(conn, self.timeout)
            except ERRORS as e:
                raise self.error(e, "open") from None
            with self.lock:
                self.opened.append(conn)
            self.local.conn = conn
        return conn

    def error(self, e: BaseException, doing: str) -> VecgptError:
        if busy(e):
            return VecgptError(
                f"sqlite store {self.path} is locked by another process ({doing}: still after {self.timeout:g} s); "
                f"wait for it to finish, or raise [store] timeout"
            )
        if type(e).__name__ in DAMAGED or damaged(e):
            return VecgptError(
                f"sqlite store {self.path} is damaged ({type(e).__name__}: {first_line(e)[:200]}); "
                f"remove it and run `vecgpt load` again"
            )
        if "extension" in str(e).lower() or type(e).__name__ == "ExtensionLoadingError":
            return VecgptError(
                f"sqlite: cannot load sqlite-vec ({first_line(e)}); pip install --force-reinstall sqlite-vec"
            )
        return VecgptError(f"sqlite store {self.path}: {doing} failed ({type(e).__name__}: {first_line(e)[:200]})")

    def rows(self, sql: str, params=()) -> list[tuple]:
        conn = self.conn
        try:
            return conn.execute(sql, params).fetchall()
        except ERRORS as e:
            raise self.error(e, sql.split(" ", 1)[0].lower()) from None

    @contextmanager
    def transaction(self, doing: str = "a write"):
        """Statements committed together, or none of them; the write lock is taken at BEGIN."""
        conn = self.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
        except ERRORS as e:
            raise self.error(e, doing) from None
        try:
            yield conn
        except BaseException as e:
            rollback(conn)
            if isinstance(e, ERRORS):
                raise self.error(e, doing) from None
            raise
        try:
            conn.execute("COMMIT")
        except ERRORS as e:
            rollback(conn)
            raise self.error(e, doing) from None

    def close(self) -> None:
        with self.lock:
            for conn in self.opened:
                conn.close()
            self.opened.clear()
        self.local = threading.local()


def settings(conn, timeout: float) -> None:
    write_ahead(conn, timeout)
    conn.execute("PRAGMA synchronous=NORMAL")  # a commit survives kill -9 (not a power cut)
    conn.execute(f"PRAGMA mmap_size={MMAP_BYTES}")
    conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")


def write_ahead(conn, timeout: float) -> None:
    """WAL mode: readers never wait for a writer, nor a writer for them. Two processes opening a new file at once
    both try to switch it, and SQLite answers one busy at once (no busy wait, a deadlock else): it tries again."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if conn.execute("PRAGMA journal_mode").fetchall()[0][0].lower() != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
            return
        except ERRORS as e:
            if not busy(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def rollback(conn) -> None:
    try:
        conn.execute("ROLLBACK")
    except ERRORS:  # none open: SQLite rolled back itself
        pass


def quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
