"""The pgvector store: collections as tables, searches as single statements, loads in one transaction."""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg import sql

from vecgpt.backends import base
from vecgpt.backends.base import Metric, record
from vecgpt.backends.pgvector.manifests import Manifests
from vecgpt.backends.pgvector.rows import Rows
from vecgpt.backends.pgvector.search import Searching
from vecgpt.backends.pgvector.session import Session
from vecgpt.backends.pgvector.split import SHARE_PAGES, SPLIT_PAGES
from vecgpt.backends.pgvector.statements import Meta, table_name
from vecgpt.backends.pgvector.texts import Texts
from vecgpt.backends.pgvector.wide import PLAIN_MAX_DIM, parts_for, width
from vecgpt.errors import VecgptError


def check_shape(dim: int, payload: int, attrs: Sequence[str]) -> None:
    if not 1 <= dim <= 16000 or not 0 <= payload <= 16000:
        raise VecgptError(
            f"pgvector holds vectors of dimension 1 to 16000 (payloads up to 16000), not {dim} ({payload})"
        )
    bad = [a for a in attrs if a in ("id", "embedding", "payload") or not a.isidentifier()]
    if bad:
        raise VecgptError(f"attribute name {bad[0]!r} is not allowed (reserved or not an identifier)")


def column_list(meta: Meta) -> sql.Composed:
    """id, one bigint per attribute, the embedding and (with a width) the payload, both pgvector columns."""
    columns = [sql.SQL("id bigint PRIMARY KEY")]
    columns += [sql.SQL("{} bigint NOT NULL DEFAULT 0").format(sql.Identifier(a)) for a in meta.attrs]
    for column, dim in zip(meta.vector_columns(), (width(meta.dim, meta.parts), meta.payload)):
        columns.append(sql.SQL("{} vector({}) NOT NULL").format(sql.Identifier(column), sql.Literal(dim)))
    return sql.SQL(", ").join(columns)


@base.closes_after_calls
class PgStore(Searching, Rows, Manifests, Texts, Session):
    metrics: tuple[Metric, ...] = ("l2", "ip")
    concurrent = False  # the engine sends requests one after another; a search may use every connection
    split_pages = SPLIT_PAGES  # weight tables of at least this many pages are scanned in pieces
    share_pages = SHARE_PAGES  # a request's pieces of at least this many pages in all use several connections

    def __init__(
        self,
        dsn: str,
        schema: str = "vecgpt",
        workers: int = 0,
        timeout: float = 5.0,
        max_retries: int = 3,
        connections: int = 2,
    ):
        self.schema = schema
        self._meta: dict[str, Meta] = {}
        self._sql: dict[tuple, str] = {}  # search statements by shape
        super().__init__(dsn, workers, timeout, max_retries, connections)
        self._setup()

    def __str__(self) -> str:
        info = self.conn.info
        where = info.host if info.host.startswith("/") else f"{info.host}:{info.port}"
        return f"PgStore({where}/{info.dbname}, schema={self.schema})"

    def _setup(self) -> None:
        s = sql.Identifier(self.schema)
        with self.conn.transaction():
            self.conn.execute(sql.SQL("SELECT pg_advisory_xact_lock(hashtext({}))").format(sql.Literal(self.schema)))
            self.conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(s))
            self.conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {}._collections (name text PRIMARY KEY, "
                    "tbl text NOT NULL, dim int NOT NULL, metric text NOT NULL, "
                    "attrs text[] NOT NULL)"
                ).format(s)
            )
            self.conn.execute(
                sql.SQL("ALTER TABLE {}._collections ADD COLUMN IF NOT EXISTS payload int NOT NULL DEFAULT 0").format(s)
            )
            self.conn.execute(
                sql.SQL("CREATE TABLE IF NOT EXISTS {}._manifest (key text PRIMARY KEY, value jsonb NOT NULL)").format(
                    s
                )
            )
            self.conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {}._texts (id text PRIMARY KEY, record jsonb NOT NULL, version int NOT NULL)"
                ).format(s)
            )

    def _table(self, meta: Meta) -> sql.Composed:
        return sql.Identifier(self.schema, meta.table)

    def _forget(self) -> None:
        self._meta.clear()
        self._sql.clear()

    def _commit(self) -> None:
        loaded = self._pending
        super()._commit()
        if loaded is not None:  # read again when next used: its size in pages is known now
            self._meta.pop(loaded, None)

    def _get(self, name: str) -> Meta | None:
        if name not in self._meta:
            row = self.conn.execute(
                sql.SQL(
                    "SELECT tbl, dim, metric, attrs, payload, (SELECT atttypmod FROM pg_attribute WHERE attname = "
                    "'embedding' AND attrelid = to_regclass(format('%%I.%%I', {0}::text, tbl))), "
                    "pg_relation_size(to_regclass(format('%%I.%%I', {0}::text, tbl))) / "
                    "current_setting('block_size')::bigint FROM {1}._collections WHERE name = %s"
                ).format(sql.Literal(self.schema), sql.Identifier(self.schema)),
                (name,),
            ).fetchone()
            if row is None:
                return None
            *row, columns, pages = row  # the embedding column's width: dim, or a part's (made before parts: dim)
            meta = Meta(*row, parts=1 if columns in (None, row[1]) else parts_for(row[1]))
            meta.pages = pages or 0
            self._meta[name] = meta
        return self._meta[name]

    def _col(self, name: str) -> Meta:
        return base.existing(self._get(name), self, name)

    # collections
    def create(self, name: str, dim: int, metric: Metric, attrs: Sequence[str] = (), payload: int = 0) -> None:
        base.check_metric("pgvector", metric, self.metrics)
        self._run(self._create, name, int(dim), metric, list(attrs), int(payload))

    def _create(self, name, dim, metric, attrs, payload):
        self._commit()
        meta = self._get(name)
        if meta is not None:
            base.check_same(name, (meta.dim, meta.metric, meta.payload), dim, metric, payload)
            return
        check_shape(dim, payload, attrs)
        meta = Meta(table_name(name), dim, metric, attrs, payload, 1 if payload else parts_for(dim))
        if base.is_text(name):  # made whole or not at all; its rows each commit on their own
            with self.conn.transaction():
                self._make(name, meta, index=True)
            return
        self.conn.execute("BEGIN")  # stays open: the collection's rows go in with it, or nothing does
        self._pending = name
        self._make(name, meta, index=False)

    def _make(self, name: str, meta: Meta, index: bool) -> None:
        """The collection's table, its columns' storage, (index: a btree on the attributes), its catalog row."""
        table = self._table(meta)
        try:
            self.conn.execute(sql.SQL("CREATE TABLE {} ({})").format(table, column_list(meta)))
        except psycopg.errors.DuplicateTable:
            raise VecgptError(f"a table {self.schema}.{meta.table} exists that is not a collection; drop it") from None
        storage = sql.SQL("PLAIN" if width(meta.dim, meta.parts) + meta.payload <= PLAIN_MAX_DIM else "EXTERNAL")
        for column in meta.vector_columns():
            self.conn.execute(
                sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET STORAGE {}").format(table, sql.Identifier(column), storage)
            )
        if index and meta.attrs:  # keys are searched by layer/head and a position range
            self.conn.execute(
                sql.SQL("CREATE INDEX ON {} ({})").format(table, sql.SQL(", ").join(map(sql.Identifier, meta.attrs)))
            )
        self._register(name, meta)

    def _register(self, name: str, meta: Meta) -> None:
        self.conn.execute(
            sql.SQL(
                "INSERT INTO {}._collections (name, tbl, dim, metric, attrs, payload) VALUES (%s, %s, %s, %s, %s, %s)"
            ).format(sql.Identifier(self.schema)),
            (name, meta.table, meta.dim, meta.metric, meta.attrs, meta.payload),
        )
        self._meta[name] = meta

    def clone(self, src: str, dst: str) -> None:
        """dst, a new collection with every row of src: copied by the server in one transaction."""
        self._run(self._clone, src, dst)

    def _clone(self, src, dst):
        self._commit()
        meta = self._col(src)
        if self._get(dst) is not None:
            raise VecgptError(f"cannot clone {src!r} to {dst!r}: {dst!r} exists; drop it first")
        new = Meta(table_name(dst), meta.dim, meta.metric, meta.attrs, meta.payload, meta.parts)
        record()
        try:
            with self.conn.transaction():
                self.conn.execute(
                    sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL)").format(self._table(new), self._table(meta))
                )
                self.conn.execute(
                    sql.SQL("INSERT INTO {} SELECT * FROM {}").format(self._table(new), self._table(meta))
                )
                self._register(dst, new)
        except psycopg.errors.DuplicateTable:
            raise VecgptError(f"a table {self.schema}.{new.table} exists that is not a collection; drop it") from None

    def drop(self, name: str) -> None:
        self._run(self._drop, name)

    def _drop(self, name):
        self._commit()
        meta = self._get(name)
        if meta is None:
            return
        with self.conn.transaction():
            self.conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self._table(meta)))
            self.conn.execute(
                sql.SQL("DELETE FROM {}._collections WHERE name = %s").format(sql.Identifier(self.schema)), (name,)
            )
        self._meta.pop(name, None)
        self._sql = {key: text for key, text in self._sql.items() if key[1] != name}

    def collections(self) -> list[str]:
        return self._run(
            lambda: sorted(
                r[0]
                for r in self.conn.execute(
                    sql.SQL("SELECT name FROM {}._collections").format(sql.Identifier(self.schema))
                )
            )
        )

    def count(self, name: str) -> int:
        def run():
            meta = self._col(name)
            rows = self.conn.execute(sql.SQL("SELECT count(*) FROM {}").format(self._table(meta))).fetchone()[0]
            return rows // meta.parts

        return self._run(run)

    def stats(self) -> dict:
        def run():
            self._commit()
            out = {}
            for name in self.collections():
                meta = self._col(name)
                n, size = self.conn.execute(
                    sql.SQL("SELECT count(*), pg_total_relation_size({}::regclass) FROM {}").format(
                        sql.Literal(f'"{self.schema}"."{meta.table}"'), self._table(meta)
                    )
                ).fetchone()
                n //= meta.parts
                row = sum(4 * d + 8 for d in (meta.dim, meta.payload)[: len(meta.vector_columns())])
                out[name] = {"documents": n, "bytes": size, "vector_bytes": n * row}
            return out

        return self._run(run)
