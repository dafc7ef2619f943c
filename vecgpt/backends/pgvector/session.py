"""One connection to PostgreSQL for a store: opened with timeouts, opened again when lost, errors in one line."""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
from psycopg import sql

from vecgpt.backends.base import first_line, retry_delay, worst_case_s
from vecgpt.backends.pgvector.dsn import ENV_DSN, describe_dsn, scrub
from vecgpt.errors import VecgptError


def open_connection(dsn: str, timeout: float) -> psycopg.Connection:
    try:
        # Over TCP, keepalives notice a server that stopped answering within about `timeout`.
        probe = max(1, int(timeout / 2))
        conn = psycopg.connect(
            dsn,
            autocommit=True,
            connect_timeout=max(2, math.ceil(timeout)),
            keepalives=1,
            keepalives_idle=probe,
            keepalives_interval=1,
            keepalives_count=probe,
            tcp_user_timeout=int(timeout * 1000),
        )
    except psycopg.OperationalError as e:
        message, where = scrub(first_line(e), dsn), describe_dsn(dsn)  # never print credentials
        if "refused" in message or "No such file" in message:
            raise VecgptError(
                f"cannot reach PostgreSQL at {where}: connection refused; start the server, fix "
                f"{ENV_DSN} or [store] dsn, or unset both for a local throwaway server"
            ) from None
        if "password" in message or "authentication" in message:
            raise VecgptError(
                f"PostgreSQL at {where} refused the login ({message}); set PGPASSWORD or put the password in {ENV_DSN}"
            ) from None
        raise VecgptError(f"cannot connect to PostgreSQL at {where}: {message}") from None
    with_vector(conn)
    return conn


def with_vector(conn: psycopg.Connection) -> None:
    """Make sure the database has the pgvector extension, and teach the connection its type."""
    try:
        if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone() is None:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except psycopg.Error as e:
        dbname = conn.info.dbname
        conn.close()
        raise VecgptError(
            f"database {dbname!r} has no pgvector extension and it could not be created "
            f"({first_line(e)}); as a superuser run CREATE EXTENSION vector in it, or install "
            f"pgvector on the server (Debian: apt install postgresql-<version>-pgvector)"
        ) from None
    from pgvector.psycopg import register_vector

    register_vector(conn)


class Session:
    """The connection, a lock around every call, and the load transaction that stays open across upserts.

    Searches may also use `connections - 1` helper connections (opened on first use, each driven by a
    thread of its own), so that a search's scan runs on as many server backends, that is cores.
    """

    def __init__(self, dsn: str, workers: int = 0, timeout: float = 5.0, max_retries: int = 3, connections: int = 1):
        self.dsn, self.workers, self.timeout, self.max_retries = dsn, workers, timeout, max_retries
        self._lock = threading.RLock()
        self._pending: str | None = None  # the collection whose load transaction is open
        self._helpers: list[psycopg.Connection | None] = [None] * (connections - 1)
        self._pool = ThreadPoolExecutor(connections - 1) if connections > 1 else None
        self.conn = self._session()

    def _session(self) -> psycopg.Connection:
        conn = open_connection(self.dsn, self.timeout)
        conn.prepare_threshold = 0  # every statement is prepared on first use ...
        conn.prepared_max = 1024  # ... and kept: one per collection and query shape
        for setting, value in (("jit", "off"), ("max_parallel_workers_per_gather", str(int(self.workers)))):
            conn.execute(sql.SQL("SET {} = {}").format(sql.Identifier(setting), sql.Literal(value)))
        return conn

    def _connections(self, n: int) -> list[psycopg.Connection]:
        """The main connection and up to n - 1 helpers, opening those not yet open (or lost). A helper that
        cannot be opened (the server's max_connections reached, say) is given up: the store goes on with fewer."""
        for i in range(n - 1):
            if self._helpers[i] is None:
                try:
                    self._helpers[i] = self._session()
                except VecgptError:
                    del self._helpers[i:]
                    break
        return [self.conn, *self._helpers[: n - 1]]

    def _run_all(self, jobs: list) -> list:
        """Call each (conn, fn, args): the first here, the rest on the helpers' threads, all at once; their
        results. Every call has ended when this returns, so no connection is left mid-statement."""
        (conn, fn, args), rest = jobs[0], jobs[1:]
        futures = [self._pool.submit(f, c, *a) for c, f, a in rest]
        try:
            first = fn(conn, *args)
        finally:
            results = [f.exception() or f.result() for f in futures]  # waits for every one
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return [first, *results]

    def _lost(self) -> bool:
        return any(c is not None and (c.broken or c.closed) for c in (self.conn, *self._helpers))

    def _forget(self) -> None:
        """Drop what is cached about the database (after a rollback)."""

    def _commit(self) -> None:
        """End the open load transaction, if any (every call but an upsert to that collection)."""
        if self._pending is not None:
            self._pending = None
            self.conn.execute("COMMIT")

    def _rollback(self) -> None:
        if not self.conn.broken and self.conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            try:
                self.conn.execute("ROLLBACK")
            except psycopg.Error:  # a command cut short (Ctrl-C inside it) left the connection unusable
                self.conn.close()
        self._pending = None  # a collection created in the transaction is gone
        for i, helper in enumerate(self._helpers):  # searches only, autocommit: a lost one is opened again
            if helper is not None and (helper.broken or helper.closed):
                self._helpers[i] = None
        self._forget()

    def _run(self, fn, *args, loading: str | None = None):
        """Call fn inside the lock; a database error rolls back and becomes a one-line VecgptError.

        Any call but an upsert to the collection being loaded (`loading`) first commits that load. A lost
        connection is opened again (up to max_retries times, with backoff) and fn tried again, unless a
        load transaction was open: that collection's rows are gone with it.
        """
        with self._lock:
            lost = None
            for attempt in range(self.max_retries + 1):
                try:
                    if self._pending is not None and self._pending != loading:
                        self._commit()
                    return fn(*args)
                except VecgptError:
                    raise
                except psycopg.Error as e:
                    loading_lost, lost_now = self._pending is not None, self._lost()
                    self._rollback()
                    if not lost_now:
                        raise VecgptError(f"PostgreSQL: {first_line(e)}") from None
                    if loading_lost:
                        raise VecgptError(
                            f"lost the connection to PostgreSQL during a load ({first_line(e)}); "
                            f"run `vecgpt load` again"
                        ) from None
                    lost = lost or e  # the first failure says what happened; later ones say "closed"
                if attempt < self.max_retries and self._reconnect(attempt):
                    continue
            raise VecgptError(
                f"lost the connection to PostgreSQL ({first_line(lost)}) and could not reconnect in "
                f"{self.max_retries} retries (at most {worst_case_s(self.timeout, self.max_retries):.0f} s); "
                f"is the server running? (timeout and max_retries in [store])"
            ) from None

    def _reconnect(self, attempt: int) -> bool:
        time.sleep(retry_delay(attempt))
        if not (self.conn.broken or self.conn.closed):  # only a helper was lost: it opens on next use
            return True
        try:
            self.conn = self._session()
        except VecgptError:
            return False
        return True

    def close(self) -> None:
        with self._lock:
            if self.conn.closed:
                return
            try:
                self._commit()
            finally:
                self.conn.close()
                for helper in self._helpers:
                    if helper is not None:
                        helper.close()
                if self._pool is not None:
                    self._pool.shutdown()
