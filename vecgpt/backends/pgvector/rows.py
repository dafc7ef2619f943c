"""Rows of the pgvector store: upserts (an INSERT ... ON CONFLICT from arrays, or a binary COPY of new rows) and
fetches by id (a COPY out), a wide document as its part rows."""

from __future__ import annotations

import numpy as np
from psycopg import sql

from vecgpt.backends import base
from vecgpt.backends.base import record
from vecgpt.backends.pgvector.statements import copy_stream, fetch_copy, read_copy
from vecgpt.backends.pgvector.wide import join, row_ids, split, width

SMALL_WRITE = 256  # upserts up to this many rows are one INSERT ... ON CONFLICT; larger ones COPY


class Rows:
    """Mixed into PgStore, which gives conn, _col, _table, _run and _commit."""

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
            at = base.positions(name, rows["int0"] // meta.parts, want)  # a document missing: an error naming it
            if meta.parts > 1:
                at = base.positions(name, rows["int0"], row_ids(want, meta.parts))
            vectors = join(rows["vec0"][at].astype(np.float32), meta.dim, meta.parts).reshape(len(want), meta.dim)
            if not payload:
                return vectors
            held = rows["vec1"][at].astype(np.float32) if meta.payload else np.zeros((len(want), 0), np.float32)
            return vectors, held.reshape(len(want), meta.payload)

        return self._run(run)
