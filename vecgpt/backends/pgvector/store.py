"""The pgvector store: collections as tables, searches as single statements, loads in one transaction."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import psycopg
from psycopg import sql

from vecgpt.backends import base
from vecgpt.backends.base import Hits, Metric, Search, Where, record
from vecgpt.backends.pgvector.arrays import numpy_arrays
from vecgpt.backends.pgvector.manifests import Manifests
from vecgpt.backends.pgvector.session import Session
from vecgpt.backends.pgvector.split import SHARE_PAGES, SPLIT_PAGES, assign, block_ranges, merge
from vecgpt.backends.pgvector.statements import Meta, copy_stream, fetch_copy, read_copy, search_sql, table_name
from vecgpt.backends.pgvector.texts import Texts
from vecgpt.backends.pgvector.wide import PLAIN_MAX_DIM, join, parts_for, row_ids, split, width
from vecgpt.errors import VecgptError

SMALL_WRITE = 256  # upserts up to this many rows are one INSERT ... ON CONFLICT; larger ones COPY


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


def arrays(found: tuple | None) -> tuple:
    """A query's (ids, dists, vectors or None), empty where it matched no row (array_agg over no rows is NULL)."""
    if found is None or found[0] is None:
        return np.zeros(0, np.int64), np.zeros(0), None
    return found


def hits(name: str, m: int, found: list[tuple], dim: int | None = None) -> Hits:
    """m queries' (ids, dists, vectors) as Hits (dim: with the rows' vectors, that wide); every query sees the
    same rows."""
    n = len(found[0][0]) if found else 0
    if any(len(f[0]) != n for f in found):
        raise VecgptError(f"search in {name!r}: queries got different numbers of rows")
    if n == 0:
        return base.no_hits(m, dim)
    if m == 1:
        ids, dists, vectors = found[0]
        return Hits(ids[None], dists[None], None if dim is None else vectors[None])
    ids, dists = np.vstack([f[0] for f in found]), np.vstack([f[1] for f in found])
    return Hits(ids, dists, None if dim is None else np.stack([f[2] for f in found]))


def fetch_rows(conn: psycopg.Connection, query: str, params: list) -> list:
    """A search statement's rows (search, query number, ids[], dists[], vectors or NULL), the arrays read into
    numpy."""
    return numpy_arrays(conn.cursor(binary=True)).execute(query, params).fetchall()


def positions(name: str, found: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Where each wanted id is among the ids found (in any order); an error naming the first one missing."""
    if len(found) == 0:
        base.check_found(name, want[:1], ())
        return np.zeros(0, np.intp)
    order = np.argsort(found)
    at = order[np.searchsorted(found, want, sorter=order).clip(0, len(found) - 1)]
    base.check_found(name, want[found[at] != want][:1], ())
    return at


@base.closes_after_calls
class PgStore(Manifests, Texts, Session):
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

    # rows
    def upsert(self, name, ids, vectors, attrs=None, payload=None) -> None:
        self._run(self._upsert, name, ids, vectors, attrs or {}, payload, loading=name)

    def _upsert(self, name, ids, vectors, attrs, payload):
        meta = self._col(name)
        ids, vectors = base.check_rows(name, ids, vectors, meta.dim)
        payload = base.check_payload(name, payload, len(ids), meta.payload)
        if len(ids) == 0:
            return
        ids, rows, columns = base.last_writes(name, ids, np.hstack([vectors, payload]), attrs, meta.attrs)
        vectors = [np.ascontiguousarray(rows[:, : meta.dim]), np.ascontiguousarray(rows[:, meta.dim :])]
        vectors = vectors[: len(meta.vector_columns())]
        if meta.parts > 1:  # a wide collection: no payload, each document as its part rows
            ids, vectors = row_ids(ids, meta.parts), [split(vectors[0], meta.parts)]
            columns = {a: np.repeat(c, meta.parts) for a, c in columns.items()}
        record()
        table = self._table(meta)
        names = sql.SQL(", ").join(map(sql.Identifier, ["id", *meta.attrs, *meta.vector_columns()]))
        # One statement either way, atomic by itself; inside a load transaction an error drops the load.
        if (
            len(ids) <= SMALL_WRITE
            or self.conn.execute(
                sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE id = ANY(%b))").format(table), (ids.tolist(),)
            ).fetchone()[0]
        ):
            self._insert(table, meta, names, ids, columns, vectors)
        else:
            self._copy(table, meta, names, ids, columns, vectors)

    def _insert(self, table, meta, names, ids, columns, vectors):
        """Rows that may replace others: one INSERT ... ON CONFLICT from arrays."""
        arrays = [sql.SQL("%b::bigint[]")] * (1 + len(meta.attrs)) + [sql.SQL("%b::vector[]")] * len(vectors)
        update = sql.SQL(", ").join(
            sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in [*meta.attrs, *meta.vector_columns()]
        )
        query = sql.SQL("INSERT INTO {} ({}) SELECT * FROM unnest({}) ON CONFLICT (id) DO UPDATE SET {}").format(
            table, names, sql.SQL(", ").join(arrays), update
        )
        self.conn.execute(query, [ids.tolist(), *(columns[a].tolist() for a in meta.attrs), *map(list, vectors)])

    def _copy(self, table, meta, names, ids, columns, vectors):
        """Rows that are all new: one binary COPY, its stream built in numpy."""
        with self.conn.cursor().copy(
            sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT BINARY)").format(table, names)
        ) as copy:
            copy.write(copy_stream(ids, [columns[a] for a in meta.attrs], vectors))

    def fetch(self, name: str, ids: np.ndarray, payload: bool = False):
        def run():
            self._commit()
            meta = self._col(name)
            want = np.asarray(ids, np.int64)
            record()
            columns = meta.vector_columns() if payload else ["embedding"]
            with self.conn.cursor().copy(fetch_copy(self._table(meta), columns, row_ids(want, meta.parts))) as copy:
                data = b"".join(copy)
            rows = read_copy(data, [width(meta.dim, meta.parts), meta.payload][: len(columns)])
            at = positions(name, rows["int0"] // meta.parts, want)  # a document missing: an error naming it
            if meta.parts > 1:
                at = positions(name, rows["int0"], row_ids(want, meta.parts))
            vectors = join(rows["vec0"][at].astype(np.float32), meta.dim, meta.parts).reshape(len(want), meta.dim)
            if not payload:
                return vectors
            held = rows["vec1"][at].astype(np.float32) if meta.payload else np.zeros((len(want), 0), np.float32)
            return vectors, held.reshape(len(want), meta.payload)

        return self._run(run)

    # search
    def search(self, name: str, queries: np.ndarray, k: int | None = None, where: Where | None = None) -> Hits:
        return self.search_many([Search(name, queries, k, where)])[0]

    def search_many(self, searches: Sequence[Search]) -> list[Hits]:
        return self._run(self._search_many, list(searches))

    def _search_many(self, searches):
        self._commit()
        metas, prepared = [], []  # each search checked in turn: the first bad one is the error
        for s in searches:
            metas.append(self._col(s.collection))
            prepared.append(base.check_vectors(s.collection, s.queries, metas[-1].dim))
        # each search's vector dimension where it asks for its rows' vectors and gets them (never a wide collection's)
        dims = [m.dim if s.vectors and m.parts == 1 else None for s, m in zip(searches, metas)]
        pieces = []  # (search number, statement, parameters, cost)
        for s_index, (s, meta, queries, dim) in enumerate(zip(searches, metas, prepared, dims)):
            if len(queries) == 0 or s.k == 0:
                continue
            ranges = self._ranges(meta, s)
            for blocks in ranges:
                text, args = self._search_sql(
                    len(pieces), meta, queries, s.k, s.where, s.collection, blocks, dim is not None
                )
                pieces.append((s_index, text, args, len(queries) * max(meta.pages, 1) / len(ranges)))
        found = self._send(pieces, sum(len(q) for q in prepared)) if pieces else {}
        mine = [[] for _ in searches]  # each search's pieces
        for p, piece in enumerate(pieces):
            mine[piece[0]].append(p)
        out = []
        for s, meta, queries, at, dim in zip(searches, metas, prepared, mine, dims):
            per_query = [
                merge([arrays(found.get((p, i))) for p in at], s.k, meta.parts) for i in range(1, len(queries) + 1)
            ]
            out.append(hits(s.collection, len(queries), per_query, dim))
        return out

    def _ranges(self, meta: Meta, s: Search) -> list:
        """The page ranges a search is split into: [None] (whole) unless a large weight table."""
        n = len(self._helpers) + 1
        whole = base.is_text(s.collection) or (s.k is not None and meta.parts > 1)  # keys; wide top-k
        return [None] if n == 1 or whole or meta.pages < self.split_pages else block_ranges(meta.pages, n)

    def _send(self, pieces: list, subqueries: int) -> dict:
        """The pieces as one UNION ALL statement per connection, sent at once: {(piece, query number): (ids, dists)}."""
        costs = [p[3] for p in pieces]
        n = min(len(self._helpers) + 1, len(pieces)) if sum(costs) >= self.share_pages else 1  # small: one is enough
        connections = self._connections(n)
        on = assign(costs, len(connections))
        jobs = []
        for c, conn in enumerate(connections):
            texts = [p[1] for p, at in zip(pieces, on) if at == c]
            query = " UNION ALL ".join(f"({t})" for t in texts) if len(texts) > 1 else texts[0]
            jobs.append((conn, fetch_rows, (query, [a for p, at in zip(pieces, on) if at == c for a in p[2]])))
        record(len(jobs), subqueries)
        return {(p, i): (ids, dists, vectors) for rows in self._run_all(jobs) for p, i, ids, dists, vectors in rows}

    def _search_sql(self, s_index, meta, queries, k, where, name, blocks=None, vectors=False):
        """One SELECT giving (search, query number, ids[], dists[], vectors[][] or NULL) rows for one search
        (blocks: the rows in that page range; vectors: the rows' vectors too): its text, params."""
        filters = []
        if where is not None:
            base.check_where(name, where, meta.attrs)
            filters = [
                (op, attr, int(value))
                for op, values in (("=", where.eq), ("<", where.lt), (">=", where.ge))
                for attr, value in sorted(values.items())
            ]
        single = len(queries) == 1
        key = (s_index, name, single, k, tuple(f[:2] for f in filters), blocks, vectors)
        text = self._sql.get(key)
        if text is None:  # composing costs more than the statement on small tables: once per shape
            text = self._sql[key] = search_sql(
                s_index,
                self._table(meta),
                meta.metric,
                single,
                k,
                [f[:2] for f in filters],
                meta.parts,
                blocks,
                vectors,
            ).as_string(self.conn)
        args = [f[2] for f in filters]
        if meta.parts > 1:  # a vector (single) or an array of vectors per part
            split_queries = split(queries, meta.parts).reshape(len(queries), meta.parts, -1)
            return text, [
                split_queries[0, p] if single else list(split_queries[:, p]) for p in range(meta.parts)
            ] + args
        return text, [queries[0] if single else list(queries), *args]
