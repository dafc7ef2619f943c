"""A pgvector store's text records, one row per text in <schema>._texts, and the lock a text is open under.

A write is one conditional statement (UPDATE ... WHERE version = expect, INSERT ... ON CONFLICT DO
NOTHING, DELETE ... WHERE version = expect): PostgreSQL re-checks the condition on the row it locks,
so of two writers expecting one version exactly one matches a row.
"""

from __future__ import annotations

import hashlib
import json
from contextlib import contextmanager, suppress

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from vecgpt.backends import base
from vecgpt.backends.pgvector.session import open_connection
from vecgpt.errors import VecgptError


def lock_key(schema: str, text_id: str) -> int:
    """A signed 64-bit advisory lock key for one text of one schema."""
    digest = hashlib.sha1(f"{schema}\x00text\x00{text_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class Texts:
    """Mixed into PgStore, whose Session gives conn, dsn, timeout, _run and _commit."""

    def _texts_table(self) -> sql.Composed:
        return sql.SQL("{}._texts").format(sql.Identifier(self.schema))

    def read_text(self, text_id: str) -> dict | None:
        def run():
            self._commit()
            return self._held(text_id)

        return self._run(run)

    def _held(self, text_id: str) -> dict | None:
        row = self.conn.execute(
            sql.SQL("SELECT record, version FROM {} WHERE id = %s").format(self._texts_table()), (text_id,)
        ).fetchone()
        return None if row is None else {**row[0], "version": row[1]}

    def write_text(self, text_id: str, record: dict | None, expect: int | None) -> int:
        body = None if record is None else {k: v for k, v in record.items() if k != "version"}
        json.dumps(body)  # fail here, not half-way, on what JSON cannot hold
        tries = []

        def run():
            self._commit()
            tries.append(1)
            if self._write(text_id, body, expect).rowcount == 1:
                return (expect or 0) + 1
            held = self._held(text_id)
            if len(tries) > 1 and self._landed(held, body, expect):
                return (expect or 0) + 1  # the first try was committed, its answer lost with the connection
            return base.check_version(text_id, None if held is None else held["version"], expect)

        return self._run(run)

    def _write(self, text_id: str, body: dict | None, expect: int | None) -> psycopg.Cursor:
        """The one conditional statement; it changed a row (rowcount 1) only if `expect` held."""
        table = self._texts_table()
        if body is None:
            return self.conn.execute(
                sql.SQL("DELETE FROM {} WHERE id = %s AND version = %s").format(table), (text_id, expect)
            )
        if expect is None:
            return self.conn.execute(
                sql.SQL("INSERT INTO {} VALUES (%s, %s, 1) ON CONFLICT (id) DO NOTHING").format(table),
                (text_id, Jsonb(body)),
            )
        return self.conn.execute(
            sql.SQL("UPDATE {} SET record = %s, version = %s WHERE id = %s AND version = %s").format(table),
            (Jsonb(body), expect + 1, text_id, expect),
        )

    @staticmethod
    def _landed(held: dict | None, body: dict | None, expect: int | None) -> bool:
        """Whether the stored record is the one this write makes (checked after a retry)."""
        if body is None:
            return held is None and expect is not None
        return held == {**json.loads(json.dumps(body)), "version": (expect or 0) + 1}

    def texts(self) -> list[str]:
        def run():
            self._commit()
            return [
                r[0] for r in self.conn.execute(sql.SQL("SELECT id FROM {} ORDER BY id").format(self._texts_table()))
            ]

        return self._run(run)

    @contextmanager
    def text_lock(self, text_id: str):
        """A session-level advisory lock on a connection of its own, held while the block runs: the server
        releases it when that connection ends, however the process ended."""
        conn, key, got = open_connection(self.dsn, self.timeout), lock_key(self.schema, text_id), False
        try:
            try:
                got = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]
            except psycopg.Error as e:
                raise VecgptError(f"PostgreSQL: {base.first_line(e)}") from None
            if not got:
                raise base.text_busy(text_id)
            yield
        finally:
            if got:  # at once: the server ends a closed connection's session a moment after close() returns
                with suppress(psycopg.Error):
                    conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
            conn.close()
