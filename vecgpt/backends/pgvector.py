"""PostgreSQL with pgvector: one table per collection, exact search by sequential scan.

A collection is a table `<schema>."<name>"` (id bigint primary key, one bigint column per
attribute, embedding vector(dim)); a catalog table `<schema>._collections` keeps the original
names, dimensions, metrics and attributes, and `<schema>._manifest` the manifest (jsonb).

Searches are single SQL statements over a sequential scan: no approximate index is ever built on
a collection. "l2" is `vector_l2_squared_distance` (no square root), "ip" is `<#>` (the negated
inner product). Both return double precision, kept as float64. A search for every row returns
`array_agg(id), array_agg(distance)` per query in one statement; several query vectors go in one
statement as `unnest($1::vector[]) WITH ORDINALITY`; `search_many` sends any number of searches as
one `UNION ALL` statement.

Storage: pgvector stores a vector(n) in 4n + 8 bytes. PostgreSQL moves any row over ~2 KB out of
line (TOAST) by default, which makes every scan chase TOAST pointers; columns that fit in a page
(dim <= 2000) are set to STORAGE PLAIN, wider ones (the MLP's c_proj, 3,074 floats) to EXTERNAL
(out of line, never compressed). See docs/pgvector.md for the measurements.

Loads: an upsert of rows that are all new is one binary COPY; rows that replace others go through
`INSERT ... ON CONFLICT`. A collection created by this connection is written in one transaction
that stays open while upserts go to that collection and commits at the first other call, so an
interrupted load leaves no half-written table (a rerun of `vecgpt load` starts it again).
`text-*` collections (a text's attention keys) are UNLOGGED tables with a btree on their
attributes, committed at every write.

Connection: `dsn` from VECGPT_PG_DSN or [store] dsn (a password only from the environment:
PGPASSWORD, ~/.pgpass or VECGPT_PG_DSN). Without either, a local PostgreSQL with pgvector is
started from the `pgserver` package in `data_dir` and stopped when the last process using it exits.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from vecgpt.backends.base import (
    Hits,
    Metric,
    Search,
    Where,
    cache_dir,
    check_found,
    check_metric,
    check_rows,
    check_same,
    check_vectors,
    check_where,
    first_line,
    last_writes,
    no_collection,
    record,
    retry_delay,
    worst_case_s,
)
from vecgpt.errors import VecgptError

ENV_DSN = "VECGPT_PG_DSN"
PLAIN_MAX_DIM = 2000  # 4 * dim + 8 bytes plus a row header must fit in one 8 KB page
SMALL_WRITE = 256  # upserts up to this many rows are one INSERT ... ON CONFLICT; larger ones COPY
# Settings of the local server pgserver starts: buffers large enough to hold GPT-2 small's
# tables (about 600 MB), and minimal WAL, so a COPY into a table created in the same transaction
# writes no WAL at all.
LOCAL_SETTINGS = {"shared_buffers": "1GB", "wal_level": "minimal", "max_wal_senders": "0",
                  "effective_cache_size": "4GB"}
DISTANCE = {"l2": "vector_l2_squared_distance({}, {})", "ip": "({} <#> {})"}


def default_data_dir() -> Path:
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # As root pgserver runs postgres as a `pgserver` user and opens every parent folder of the
        # data directory to others; /var/tmp keeps that away from /root.
        return Path("/var/tmp/vecgpt/pgserver")
    return cache_dir("pgserver")


_servers: dict[Path, object] = {}


def local_server(data_dir: str | Path | None = None, cleanup: str = "stop",
                 settings: Mapping[str, str] | None = None) -> str:
    """Start (or join) a pgserver PostgreSQL in data_dir; its connection string.

    cleanup "stop": the last process holding it stops it at exit (the data stays); "delete": also
    removes the folder. Settings are written with ALTER SYSTEM and the server restarted, once.
    """
    import logging
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR is not set
            import pgserver
    except ImportError:
        raise VecgptError("no PostgreSQL given (set VECGPT_PG_DSN or [store] dsn) and no pgserver to start one: "
                          "pip install 'vecgpt[pgvector]'") from None
    path = Path(data_dir or default_data_dir()).expanduser().resolve()
    if path in _servers:
        return _servers[path].get_uri()
    logging.getLogger("pgserver").setLevel(logging.ERROR)
    path.parent.mkdir(parents=True, exist_ok=True)

    def start(mode):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR is not set
                return pgserver.get_server(path, cleanup_mode=mode)
        except Exception as e:
            raise VecgptError(f"could not start a local PostgreSQL in {path} ({first_line(e)}); see {path / 'log'}, "
                              f"or set {ENV_DSN} to use a running server") from None

    settings = LOCAL_SETTINGS if settings is None else settings
    server = start("stop" if settings else cleanup)
    if settings:
        with psycopg.connect(server.get_uri(), autocommit=True) as conn:
            current = {k: conn.execute(sql.SQL("SELECT current_setting({})").format(sql.Literal(k))).fetchone()[0]
                       for k in settings}
            changed = {k: v for k, v in settings.items() if current[k].lower() != str(v).lower()}
            for key, value in changed.items():
                conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(key), sql.Literal(str(value))))
        if changed:  # shared_buffers and wal_level take a restart: stop the server and start it again
            server.cleanup()  # mode "stop": stops it unless another process holds it (then: at its next start)
            server = start(cleanup)
    server.cleanup_mode = cleanup
    _servers[path] = server
    return server.get_uri()


def dsn_params(dsn: str, where: str) -> dict:
    try:
        return psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as e:  # libpq may quote the string, password included: not shown
        raise VecgptError(f"{where} is not a PostgreSQL connection string ({first_line(e).split(':')[0]})") from None


def describe_dsn(dsn: str) -> str:
    """host:port/dbname of a connection string: never its user or password, wherever they were written."""
    params = dsn_params(dsn, "the DSN")
    return f"{params.get('host') or params.get('hostaddr') or 'localhost'}:{params.get('port') or 5432}/" \
           f"{params.get('dbname') or ''}"


def scrub(message: str, dsn: str) -> str:
    """A libpq message with the DSN's password, if any, blotted out."""
    try:
        password = dsn_params(dsn, "the DSN").get("password")
    except VecgptError:  # unreadable, so its password cannot be found: show nothing of the message
        return "the connection string cannot be read"
    return message.replace(password, "***") if password else message


def check_dsn_has_no_password(dsn: str) -> None:
    params = dsn_params(dsn, "[store] dsn")
    if params.get("password"):
        raise VecgptError("[store] dsn must not hold a password: put it in PGPASSWORD or ~/.pgpass, "
                          f"or give the whole DSN in {ENV_DSN}")


def connect(dsn: str | None = None, schema: str = "vecgpt", data_dir: str | None = None,
            workers: int = 0, keep_server: bool = False, timeout: float = 5.0, max_retries: int = 3) -> PgStore:
    """dsn: a libpq connection string (VECGPT_PG_DSN wins); none: a local pgserver in data_dir.

    workers: parallel workers per scan (max_parallel_workers_per_gather); keep_server: leave the
    local server running when this process exits; timeout: seconds to wait for a connection (and, over
    TCP, for a silent server); max_retries: reconnections tried when the connection is lost.
    """
    if not timeout > 0 or max_retries < 0:
        raise VecgptError(f"pgvector: timeout must be > 0 and max_retries >= 0 (got {timeout}, {max_retries})")
    env = os.environ.get(ENV_DSN)
    if env:
        dsn = env
        dsn_params(dsn, ENV_DSN)
    elif dsn:
        check_dsn_has_no_password(dsn)
    else:
        dsn = local_server(data_dir, cleanup=None if keep_server else "stop")
    return PgStore(dsn, schema, workers, timeout, max_retries)


COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + b"\x00" * 8
COPY_TRAILER = b"\xff\xff"


def copy_stream(ids: np.ndarray, attrs: list[np.ndarray], vectors: np.ndarray) -> bytes:
    """PostgreSQL's binary COPY format for rows (id, attrs..., vector), all big-endian."""
    n, dim = vectors.shape
    fields = [("count", ">i2")]
    for i in range(1 + len(attrs)):
        fields += [(f"len{i}", ">i4"), (f"int{i}", ">i8")]
    fields += [("vlen", ">i4"), ("dim", ">i2"), ("unused", ">i2"), ("vec", ">f4", (dim,))]
    rows = np.zeros(n, np.dtype(fields))
    rows["count"] = 2 + len(attrs)
    for i, column in enumerate([ids, *attrs]):
        rows[f"len{i}"], rows[f"int{i}"] = 8, column
    rows["vlen"], rows["dim"], rows["vec"] = 4 + 4 * dim, dim, vectors
    return COPY_HEADER + rows.tobytes() + COPY_TRAILER


class Meta:
    def __init__(self, table: str, dim: int, metric: Metric, attrs: Sequence[str]):
        self.table, self.dim, self.metric, self.attrs = table, dim, metric, list(attrs)


def table_name(name: str) -> str:
    """The table of a collection: its own name where PostgreSQL allows (63 bytes, not _-prefixed)."""
    if len(name.encode()) <= 63 and not name.startswith("_") and "\x00" not in name:
        return name
    return "c_" + hashlib.sha1(name.encode()).hexdigest()[:32]


class PgStore:
    metrics: tuple[Metric, ...] = ("l2", "ip")
    concurrent = False  # one connection; the engine sends requests one after another

    def __init__(self, dsn: str, schema: str = "vecgpt", workers: int = 0, timeout: float = 5.0,
                 max_retries: int = 3):
        self.dsn, self.schema, self.workers = dsn, schema, workers
        self.timeout, self.max_retries = timeout, max_retries
        self._lock = threading.RLock()
        self._meta: dict[str, Meta] = {}
        self._sql: dict[tuple, str] = {}  # search statements by shape
        self._pending: str | None = None  # the collection whose load transaction is open
        self.conn = self._session()
        self._setup()

    def _session(self):
        conn = self._connect(self.dsn)
        conn.prepare_threshold = 0  # every statement is prepared on first use ...
        conn.prepared_max = 1024  # ... and kept: one per collection and query shape
        for setting, value in (("jit", "off"), ("max_parallel_workers_per_gather", str(int(self.workers)))):
            conn.execute(sql.SQL("SET {} = {}").format(sql.Identifier(setting), sql.Literal(value)))
        return conn

    def __str__(self) -> str:
        info = self.conn.info
        where = info.host if info.host.startswith("/") else f"{info.host}:{info.port}"
        return f"PgStore({where}/{info.dbname}, schema={self.schema})"

    # connection
    def _connect(self, dsn: str):
        try:
            # Over TCP, keepalives notice a server that stopped answering within about `timeout`.
            probe = max(1, int(self.timeout / 2))
            conn = psycopg.connect(dsn, autocommit=True, connect_timeout=max(2, math.ceil(self.timeout)),
                                   keepalives=1, keepalives_idle=probe, keepalives_interval=1, keepalives_count=probe,
                                   tcp_user_timeout=int(self.timeout * 1000))
        except psycopg.OperationalError as e:
            message, where = scrub(first_line(e), dsn), describe_dsn(dsn)  # never print credentials
            if "refused" in message or "No such file" in message:
                raise VecgptError(f"cannot reach PostgreSQL at {where}: connection refused; start the server, fix "
                                  f"{ENV_DSN} or [store] dsn, or unset both for a local throwaway server") from None
            if "password" in message or "authentication" in message:
                raise VecgptError(f"PostgreSQL at {where} refused the login ({message}); set PGPASSWORD or put "
                                  f"the password in {ENV_DSN}") from None
            raise VecgptError(f"cannot connect to PostgreSQL at {where}: {message}") from None
        try:
            if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone() is None:
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        except psycopg.Error as e:
            dbname = conn.info.dbname
            conn.close()
            raise VecgptError(f"database {dbname!r} has no pgvector extension and it could not be created "
                              f"({first_line(e)}); as a superuser run CREATE EXTENSION vector in it, or install "
                              f"pgvector on the server (Debian: apt install postgresql-<version>-pgvector)") from None
        from pgvector.psycopg import register_vector

        register_vector(conn)
        return conn

    def _setup(self) -> None:
        s = sql.Identifier(self.schema)
        with self.conn.transaction():
            self.conn.execute(sql.SQL("SELECT pg_advisory_xact_lock(hashtext({}))").format(sql.Literal(self.schema)))
            self.conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(s))
            self.conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {}._collections (name text PRIMARY KEY, "
                                      "tbl text NOT NULL, dim int NOT NULL, metric text NOT NULL, "
                                      "attrs text[] NOT NULL)").format(s))
            self.conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {}._manifest (key text PRIMARY KEY, "
                                      "value jsonb NOT NULL)").format(s))

    def _table(self, meta: Meta) -> sql.Composed:
        return sql.Identifier(self.schema, meta.table)

    def _commit(self) -> None:
        """End the open load transaction, if any (every call but an upsert to that collection)."""
        if self._pending is not None:
            self._pending = None
            self.conn.execute("COMMIT")

    def _rollback(self) -> None:
        if not self.conn.broken and self.conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            self.conn.execute("ROLLBACK")
        if self._pending is not None:
            self._meta.pop(self._pending, None)  # a collection created in the transaction is gone
            self._pending = None
        self._meta.clear()
        self._sql.clear()

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
                    loading_lost = self._pending is not None
                    self._rollback()
                    if not self.conn.broken:
                        raise VecgptError(f"PostgreSQL: {first_line(e)}") from None
                    if loading_lost:
                        raise VecgptError(f"lost the connection to PostgreSQL during a load ({first_line(e)}); "
                                          f"run `vecgpt load` again") from None
                    lost = lost or e  # the first failure says what happened; later ones say "closed"
                if attempt < self.max_retries and self._reconnect(attempt):
                    continue
            raise VecgptError(f"lost the connection to PostgreSQL ({first_line(lost)}) and could not reconnect in "
                              f"{self.max_retries} retries (at most {worst_case_s(self.timeout, self.max_retries):.0f} s); "
                              f"is the server running? (timeout and max_retries in [store])") from None

    def _reconnect(self, attempt: int) -> bool:
        time.sleep(retry_delay(attempt))
        try:
            self.conn = self._session()
        except VecgptError:
            return False
        return True

    def _get(self, name: str) -> Meta | None:
        if name not in self._meta:
            row = self.conn.execute(sql.SQL("SELECT tbl, dim, metric, attrs FROM {}._collections WHERE name = %s")
                                    .format(sql.Identifier(self.schema)), (name,)).fetchone()
            if row is None:
                return None
            self._meta[name] = Meta(*row)
        return self._meta[name]

    def _col(self, name: str) -> Meta:
        meta = self._get(name)
        if meta is None:
            raise no_collection(f"pgvector store {self}", name)
        return meta

    # collections
    def create(self, name: str, dim: int, metric: Metric, attrs: Sequence[str] = ()) -> None:
        check_metric("pgvector", metric, self.metrics)
        self._run(self._create, name, int(dim), metric, list(attrs))

    def _create(self, name, dim, metric, attrs):
        self._commit()
        meta = self._get(name)
        if meta is not None:
            check_same(name, (meta.dim, meta.metric), dim, metric)
            return
        if not 1 <= dim <= 16000:
            raise VecgptError(f"pgvector holds vectors of dimension 1 to 16000, not {dim}")
        bad = [a for a in attrs if a in ("id", "embedding") or not a.isidentifier()]
        if bad:
            raise VecgptError(f"attribute name {bad[0]!r} is not allowed (reserved or not an identifier)")
        meta = Meta(table_name(name), dim, metric, attrs)
        text = name.startswith("text-")
        columns = [sql.SQL("id bigint PRIMARY KEY")]
        columns += [sql.SQL("{} bigint NOT NULL DEFAULT 0").format(sql.Identifier(a)) for a in attrs]
        columns.append(sql.SQL("embedding vector({}) NOT NULL").format(sql.Literal(dim)))
        storage = sql.SQL("PLAIN" if dim <= PLAIN_MAX_DIM else "EXTERNAL")
        if not text:  # stays open: the collection's rows go in with it, or nothing does
            self.conn.execute("BEGIN")
            self._pending = name
        try:
            self.conn.execute(sql.SQL("CREATE {}TABLE {} ({})").format(
                sql.SQL("UNLOGGED " if text else ""), self._table(meta), sql.SQL(", ").join(columns)))
            self.conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN embedding SET STORAGE {}").format(self._table(meta), storage))
            if text and attrs:  # keys are searched by layer/head and a position range
                self.conn.execute(sql.SQL("CREATE INDEX ON {} ({})").format(
                    self._table(meta), sql.SQL(", ").join(map(sql.Identifier, attrs))))
            self.conn.execute(sql.SQL("INSERT INTO {}._collections VALUES (%s, %s, %s, %s, %s)")
                              .format(sql.Identifier(self.schema)), (name, meta.table, dim, metric, attrs))
        except psycopg.errors.DuplicateTable:
            raise VecgptError(f"a table {self.schema}.{meta.table} exists that is not a collection; drop it") from None
        self._meta[name] = meta

    def drop(self, name: str) -> None:
        self._run(self._drop, name)

    def _drop(self, name):
        self._commit()
        meta = self._get(name)
        if meta is None:
            return
        with self.conn.transaction():
            self.conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self._table(meta)))
            self.conn.execute(sql.SQL("DELETE FROM {}._collections WHERE name = %s").format(sql.Identifier(self.schema)), (name,))
        self._meta.pop(name, None)
        self._sql = {key: text for key, text in self._sql.items() if key[1] != name}

    def collections(self) -> list[str]:
        return self._run(lambda: sorted(r[0] for r in self.conn.execute(
            sql.SQL("SELECT name FROM {}._collections").format(sql.Identifier(self.schema)))))

    def count(self, name: str) -> int:
        return self._run(lambda: self.conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(self._table(self._col(name)))).fetchone()[0])

    def stats(self) -> dict:
        def run():
            self._commit()
            out = {}
            for name in self.collections():
                meta = self._col(name)
                n, size = self.conn.execute(sql.SQL("SELECT count(*), pg_total_relation_size({}::regclass) FROM {}").format(
                    sql.Literal(f'"{self.schema}"."{meta.table}"'), self._table(meta))).fetchone()
                out[name] = {"documents": n, "bytes": size, "vector_bytes": n * (4 * meta.dim + 8)}
            return out
        return self._run(run)

    # rows
    def upsert(self, name: str, ids: np.ndarray, vectors: np.ndarray,
               attrs: Mapping[str, np.ndarray] | None = None) -> None:
        self._run(self._upsert, name, ids, vectors, attrs or {}, loading=name)

    def _upsert(self, name, ids, vectors, attrs):
        meta = self._col(name)
        ids, vectors = check_rows(name, ids, vectors, meta.dim)
        if len(ids) == 0:
            return
        unknown = set(attrs) - set(meta.attrs)
        if unknown:
            raise VecgptError(f"upsert into {name!r}: unknown attribute {sorted(unknown)[0]!r}; it has {meta.attrs}")
        ids, vectors, columns = last_writes(ids, vectors, attrs, meta.attrs)
        record()
        table = self._table(meta)
        names = sql.SQL(", ").join(map(sql.Identifier, ["id", *meta.attrs, "embedding"]))
        # One statement either way, atomic by itself; inside a load transaction an error drops the load.
        if len(ids) <= SMALL_WRITE or self.conn.execute(
                sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE id = ANY(%b))").format(table), (ids.tolist(),)).fetchone()[0]:
            self._insert(table, meta, names, ids, columns, vectors)
        else:
            self._copy(table, meta, names, ids, columns, vectors)

    def _insert(self, table, meta, names, ids, columns, vectors):
        """Rows that may replace others: one INSERT ... ON CONFLICT from arrays."""
        arrays = [sql.SQL("%b::bigint[]")] * (1 + len(meta.attrs)) + [sql.SQL("%b::vector[]")]
        update = sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c))
                                    for c in [*meta.attrs, "embedding"])
        query = sql.SQL("INSERT INTO {} ({}) SELECT * FROM unnest({}) ON CONFLICT (id) DO UPDATE SET {}").format(
            table, names, sql.SQL(", ").join(arrays), update)
        self.conn.execute(query, [ids.tolist(), *(columns[a].tolist() for a in meta.attrs), list(vectors)])

    def _copy(self, table, meta, names, ids, columns, vectors):
        """Rows that are all new: one binary COPY, its stream built in numpy."""
        with self.conn.cursor().copy(sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT BINARY)").format(table, names)) as copy:
            copy.write(copy_stream(ids, [columns[a] for a in meta.attrs], vectors))

    def fetch(self, name: str, ids: np.ndarray) -> np.ndarray:
        def run():
            self._commit()
            meta = self._col(name)
            want = np.asarray(ids, np.int64)
            record()
            rows = self.conn.cursor(binary=True).execute(
                sql.SQL("SELECT id, embedding FROM {} WHERE id = ANY(%b)").format(self._table(meta)), (want.tolist(),)).fetchall()
            found = {int(i): v for i, v in rows}
            check_found(name, want, found)
            return np.array([found[int(i)].to_numpy() if hasattr(found[int(i)], "to_numpy") else found[int(i)]
                             for i in want], np.float32).reshape(len(want), meta.dim)
        return self._run(run)

    # search
    def search(self, name: str, queries: np.ndarray, k: int | None = None, where: Where | None = None) -> Hits:
        return self.search_many([Search(name, queries, k, where)])[0]

    def search_many(self, searches: Sequence[Search]) -> list[Hits]:
        return self._run(self._search_many, list(searches))

    def _search_many(self, searches):
        self._commit()
        parts, params, prepared = [], [], []
        for s_index, s in enumerate(searches):
            meta = self._col(s.collection)
            queries = check_vectors(s.collection, s.queries, meta.dim)
            prepared.append(queries)
            if len(queries) == 0 or s.k == 0:
                continue
            part, args = self._search_sql(s_index, meta, queries, s.k, s.where, s.collection)
            parts.append(part)
            params += args
        out = [None] * len(searches)
        if parts:
            record(1, sum(len(q) for q in prepared))
            query = " UNION ALL ".join(f"({p})" for p in parts) if len(parts) > 1 else parts[0]
            rows = self.conn.cursor(binary=True).execute(query, params).fetchall()
            got: dict[int, dict[int, tuple]] = {}
            for s_index, i, ids, dists in rows:
                got.setdefault(s_index, {})[i] = (ids, dists)
            for s_index, s in enumerate(searches):
                found = got.get(s_index)
                if found is not None:
                    m = len(prepared[s_index])
                    ids = [found.get(i, ([], []))[0] or [] for i in range(1, m + 1)]
                    dists = [found.get(i, ([], []))[1] or [] for i in range(1, m + 1)]
                    n = len(ids[0])
                    if any(len(r) != n for r in ids):  # every query sees the same rows
                        raise VecgptError(f"search in {s.collection!r}: queries got different numbers of rows")
                    out[s_index] = Hits(np.array(ids, np.int64).reshape(m, n), np.array(dists, np.float64).reshape(m, n))
        for s_index, hits in enumerate(out):
            if hits is None:
                out[s_index] = Hits(np.zeros((len(prepared[s_index]), 0), np.int64), np.zeros((len(prepared[s_index]), 0)))
        return out

    def _search_sql(self, s_index, meta, queries, k, where, name):
        """One SELECT giving (search, query number, ids[], dists[]) rows for one search: its text, params."""
        filters = []
        if where is not None:
            check_where(name, where, meta.attrs)
            filters = [(op, attr, int(value)) for op, values in (("=", where.eq), ("<", where.lt), (">=", where.ge))
                       for attr, value in sorted(values.items())]
        single = len(queries) == 1
        key = (s_index, name, single, k, tuple(f[:2] for f in filters))
        text = self._sql.get(key)
        if text is None:  # composing costs more than the statement on small tables: once per shape
            text = self._sql[key] = self._compose(s_index, meta, single, k, [f[:2] for f in filters]).as_string(self.conn)
        args = [f[2] for f in filters]
        return text, [queries[0] if single else list(queries), *args]

    def _compose(self, s_index, meta, single, k, filters):
        conditions = [sql.SQL("t.{} " + op + " %s").format(sql.Identifier(attr)) for op, attr in filters]
        cond = sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conditions) if conditions else sql.SQL("")
        q = sql.SQL("%b::vector") if single else sql.SQL("q.v")
        dist = sql.SQL(DISTANCE[meta.metric]).format(sql.SQL("t.embedding"), q)
        fmt = dict(s=sql.Literal(s_index), table=self._table(meta), dist=dist, cond=cond)
        if k is None:
            if single:
                text = "SELECT {s}::int, 1::bigint, array_agg(t.id), array_agg({dist}) FROM {table} t{cond}"
            else:
                text = ("SELECT {s}::int, q.i, array_agg(t.id), array_agg({dist}) FROM {table} t "
                        "CROSS JOIN unnest(%b::vector[]) WITH ORDINALITY q(v, i){cond} GROUP BY q.i")
        else:
            fmt["k"] = sql.Literal(int(k))
            if single:
                text = ("SELECT {s}::int, 1::bigint, array_agg(x.id ORDER BY x.d, x.id), array_agg(x.d ORDER BY x.d, x.id) "
                        "FROM (SELECT t.id, {dist} AS d FROM {table} t{cond} ORDER BY d, t.id LIMIT {k}) x")
            else:
                text = ("SELECT {s}::int, q.i, array_agg(x.id ORDER BY x.d, x.id), array_agg(x.d ORDER BY x.d, x.id) "
                        "FROM unnest(%b::vector[]) WITH ORDINALITY q(v, i) CROSS JOIN LATERAL "
                        "(SELECT t.id, {dist} AS d FROM {table} t{cond} ORDER BY d, t.id LIMIT {k}) x GROUP BY q.i")
        return sql.SQL(text).format(**fmt)

    # manifest
    def read_manifest(self) -> dict | None:
        def run():
            self._commit()
            row = self.conn.execute(sql.SQL("SELECT value FROM {}._manifest WHERE key = 'manifest'")
                                    .format(sql.Identifier(self.schema))).fetchone()
            return None if row is None else row[0]
        return self._run(run)

    def write_manifest(self, manifest: dict | None) -> None:
        def run():
            self._commit()
            table = sql.SQL("{}._manifest").format(sql.Identifier(self.schema))
            if manifest is None:
                self.conn.execute(sql.SQL("DELETE FROM {} WHERE key = 'manifest'").format(table))
            else:
                json.dumps(manifest)  # fail here, not half-way, on what JSON cannot hold
                self.conn.execute(sql.SQL("INSERT INTO {} VALUES ('manifest', %s) ON CONFLICT (key) DO UPDATE "
                                          "SET value = EXCLUDED.value").format(table), (Jsonb(manifest),))
        self._run(run)

    @contextmanager
    def load_lock(self):
        """One load per schema at a time, across processes: a session-level advisory lock."""
        key = sql.SQL("hashtext({}), 1").format(sql.Literal(self.schema))
        self._run(lambda: self.conn.execute(sql.SQL("SELECT pg_advisory_lock({})").format(key)))
        try:
            yield
        finally:
            if not self.conn.broken:  # a lost session has released it
                self._run(lambda: self.conn.execute(sql.SQL("SELECT pg_advisory_unlock({})").format(key)))

    def close(self) -> None:
        with self._lock:
            if self.conn.closed:
                return
            try:
                self._commit()
            finally:
                self.conn.close()
