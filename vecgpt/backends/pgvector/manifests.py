"""A pgvector store's manifests, one row per model in <schema>._manifest, and its load lock.

The previous layout kept one row under the key 'manifest'; it is never listed as a model.
"""

from __future__ import annotations

import json
from contextlib import contextmanager

from psycopg import sql
from psycopg.types.json import Jsonb


class Manifests:
    """Mixed into PgStore, whose Session gives conn, _run and _commit."""

    def read_manifest(self, key: str) -> dict | None:
        def run():
            self._commit()
            row = self.conn.execute(
                sql.SQL("SELECT value FROM {}._manifest WHERE key = %s").format(sql.Identifier(self.schema)), (key,)
            ).fetchone()
            return None if row is None else row[0]

        return self._run(run)

    def write_manifest(self, key: str, manifest: dict | None) -> None:
        def run():
            self._commit()
            table = sql.SQL("{}._manifest").format(sql.Identifier(self.schema))
            if manifest is None:
                self.conn.execute(sql.SQL("DELETE FROM {} WHERE key = %s").format(table), (key,))
            else:
                json.dumps(manifest)  # fail here, not half-way, on what JSON cannot hold
                self.conn.execute(
                    sql.SQL(
                        "INSERT INTO {} VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
                    ).format(table),
                    (key, Jsonb(manifest)),
                )

        self._run(run)

    def manifests(self) -> list[str]:
        def run():
            self._commit()
            rows = self.conn.execute(
                sql.SQL("SELECT key FROM {}._manifest WHERE key <> 'manifest'").format(sql.Identifier(self.schema))
            ).fetchall()
            return [r[0] for r in rows]

        return self._run(run)

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
