"""A PostgreSQL server with pgvector for the tests: VECGPT_PG_DSN if set, else a throwaway pgserver.

The throwaway server starts once per run, on the first test that asks for it, in a temporary
folder; pgserver stops it and deletes the folder when the run exits. Each test gets its own schema
(named after its tmp_path), so tests never see each other's collections.
"""

from __future__ import annotations

import hashlib
import os
import tempfile

_dsn: str | None = None


def server_dsn() -> str:
    global _dsn
    if _dsn is None:
        from vecgpt.backends.pgvector import ENV_DSN, local_server

        _dsn = os.environ.get(ENV_DSN) or local_server(
            tempfile.mkdtemp(prefix="vecgpt-pg-"), cleanup="delete", settings={"shared_buffers": "128MB"}
        )
    return _dsn


def options(tmp_path) -> dict:
    schema = "test_" + hashlib.sha1(str(tmp_path).encode()).hexdigest()[:16]
    return {"dsn": server_dsn(), "schema": schema}
