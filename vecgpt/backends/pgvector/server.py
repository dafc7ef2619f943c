"""A local PostgreSQL with pgvector, started from the pgserver package when no DSN is given."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Mapping
from pathlib import Path

import psycopg
from psycopg import sql

from vecgpt.backends.base import cache_dir, first_line, user_name
from vecgpt.backends.pgvector.dsn import ENV_DSN
from vecgpt.errors import VecgptError
from vecgpt.paths import expand


def buffers_gb() -> int:
    """shared_buffers in whole GB: a quarter of the machine's memory (PostgreSQL's own advice), 1 to 8 GB. A model's
    tables that outgrow it are read from the page cache or disk on every search: pgvector's time a token stepped up
    from GPT-2 medium (2.6 GB of tables) at a fixed 1 GB (experiments/07_sizes)."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not Linux or a BSD: the former fixed size
        return 1
    return max(1, min(8, total // 4 // 2**30))


# Buffers for a model's tables (buffers_gb), and minimal WAL, so a COPY into a table created in the same
# transaction writes no WAL at all.
LOCAL_SETTINGS = {
    "shared_buffers": f"{buffers_gb()}GB",
    "wal_level": "minimal",
    "max_wal_senders": "0",
    "effective_cache_size": f"{max(4, 2 * buffers_gb())}GB",
}

_servers: dict[Path, object] = {}


def default_data_dir() -> Path:
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # As root pgserver runs postgres as a `pgserver` user and opens every parent folder of the
        # data directory to others; /var/tmp keeps that away from /root. One folder per user name
        # (base.user_name: $LOGNAME or $USER first), so two users do not share a server by default.
        return Path(f"/var/tmp/vecgpt-{user_name()}/pgserver")
    return cache_dir("pgserver")


def local_server(
    data_dir: str | Path | None = None, cleanup: str = "stop", settings: Mapping[str, str] | None = None
) -> str:
    """Start (or join) a pgserver PostgreSQL in data_dir; its connection string.

    cleanup "stop": the last process holding it stops it at exit (the data stays); "delete": also
    removes the folder. Settings are written with ALTER SYSTEM and the server restarted, once.
    """
    path = expand(data_dir or default_data_dir()).resolve()
    if path in _servers:
        return _servers[path].get_uri()
    logging.getLogger("pgserver").setLevel(logging.ERROR)
    path.parent.mkdir(parents=True, exist_ok=True)
    settings = LOCAL_SETTINGS if settings is None else settings
    server = start(path, "stop" if settings else cleanup)
    if settings and apply(server.get_uri(), settings):  # shared_buffers and wal_level take a restart
        server.cleanup()  # mode "stop": stops it unless another process holds it (then: at its next start)
        server = start(path, cleanup)
    server.cleanup_mode = cleanup
    _servers[path] = server
    return server.get_uri()


def start(path: Path, cleanup: str | None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR is not set
        try:
            import pgserver
        except ImportError:
            raise VecgptError(
                f"no PostgreSQL given (set {ENV_DSN} or [store] dsn) and no pgserver to start one: "
                "pip install 'vecgpt[pgvector]'"
            ) from None
        try:
            return pgserver.get_server(path, cleanup_mode=cleanup)
        except Exception as e:
            raise VecgptError(
                f"could not start a local PostgreSQL in {path} ({first_line(e)}); see {path / 'log'}, "
                f"or set {ENV_DSN} to use a running server"
            ) from None


def apply(uri: str, settings: Mapping[str, str]) -> bool:
    """ALTER SYSTEM the settings that differ; whether any did."""
    with psycopg.connect(uri, autocommit=True) as conn:
        current = {
            k: conn.execute(sql.SQL("SELECT current_setting({})").format(sql.Literal(k))).fetchone()[0]
            for k in settings
        }
        changed = {k: v for k, v in settings.items() if current[k].lower() != str(v).lower()}
        for key, value in changed.items():
            conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(key), sql.Literal(str(value))))
    return bool(changed)
