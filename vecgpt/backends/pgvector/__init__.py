"""PostgreSQL with pgvector: one table per collection, exact search by sequential scan.

Environment: VECGPT_PG_DSN (a whole connection string, password included; wins over [store] dsn),
libpq's own PGPASSWORD, PGUSER, PGHOST ... and ~/.pgpass, and XDG_CACHE_HOME (where the local
server's data_dir is by default). See docs/pgvector.md.

Modules: session (the connection and its retries), store (collections and clones), rows (upserts and fetches),
search (searches: a search_many one UNION ALL statement a connection),
texts (text records and the lock a text is open under), manifests (model records, the load lock),
statements (table names, search SQL, the binary COPY streams), dsn (connection strings without
their passwords), server (a local PostgreSQL from pgserver).
"""

from __future__ import annotations

import os

from vecgpt.backends.base import user_name
from vecgpt.backends.pgvector.dsn import ENV_DSN, check_dsn_has_no_password, describe_dsn, dsn_params, scrub
from vecgpt.backends.pgvector.server import local_server
from vecgpt.backends.pgvector.store import PgStore
from vecgpt.errors import VecgptError

PREFERRED_METRIC = "ip"  # <#> has no pad and no decoding arithmetic: faster than <->, as exact (docs/speed.md)


def NETWORKED(dsn: str | None = None, **_) -> bool:  # noqa: N802 (config.auto_layout: a flag or a function)
    """A server named by a DSN is behind a network; pgvector's own local server (pgserver) is not."""
    return bool(dsn or os.environ.get(ENV_DSN))


MAX_CONNECTIONS = 64  # one server backend each; a scan gains nothing from more than the server's cores

__all__ = ["ENV_DSN", "PgStore", "connect", "describe_dsn", "dsn_params", "local_server", "scrub"]


def connect(
    dsn: str | None = None,
    schema: str | None = None,
    data_dir: str | None = None,
    workers: int = 0,
    keep_server: bool = False,
    timeout: float = 5.0,
    max_retries: int = 3,
    connections: int = 2,
) -> PgStore:
    """dsn: a libpq connection string (VECGPT_PG_DSN wins); none: a local pgserver in data_dir.

    schema: where the store's tables go (`--store`); default vecgpt_<user>, so users of one database
    never share a store by accident.

    workers: parallel workers per scan (max_parallel_workers_per_gather); keep_server: leave the
    local server running when this process exits; timeout: seconds to wait for a connection (and, over
    TCP, for a silent server); max_retries: reconnections tried when the connection is lost;
    connections: a large scan is split over this many connections, one server backend (core) each.
    """
    if not timeout > 0 or max_retries < 0:
        raise VecgptError(f"pgvector: timeout must be > 0 and max_retries >= 0 (got {timeout}, {max_retries})")
    if not 1 <= connections <= MAX_CONNECTIONS:
        raise VecgptError(f"[store] connections must be 1 to {MAX_CONNECTIONS}, not {connections}")
    env = os.environ.get(ENV_DSN)
    if env:
        dsn = env
        dsn_params(dsn, ENV_DSN)
    elif dsn:
        check_dsn_has_no_password(dsn)
    else:
        dsn = local_server(data_dir, cleanup=None if keep_server else "stop")
    return PgStore(dsn, schema or f"vecgpt_{user_name()}", workers, timeout, max_retries, connections)
