"""SQLite with sqlite-vec: one vec0 table per collection in one database file, searched by exact brute-force KNN
with the attributes filtered during the scan; the catalog, manifests and text records in the same file.

Environment: XDG_CACHE_HOME (the default folder, $XDG_CACHE_HOME/vecgpt/sqlite or ~/.cache/vecgpt/sqlite). See
docs/sqlite.md.

Modules: store (collections, rows, searches, manifests, texts), knn (KNN statements, the split past sqlite-vec's
k limit, distances squared), db (the connection: apsw or sqlite3, settings, transactions, errors).
"""

from __future__ import annotations

import os

from vecgpt.backends.sqlite.store import SqliteStore
from vecgpt.encoding import U32
from vecgpt.errors import VecgptError

__all__ = ["SqliteStore", "connect"]

# sqlite-vec returns fl32(sqrt(D')), D' its float32 sum; squared (exactly, in float64) that is D' (1 + d)^2 with
# |d| <= u, so the squared distance is within gamma_{n+3} S + gamma_2 (1 + gamma_{n+3}) S <= gamma_{n+5} S of the
# exact one (D <= S). gamma_{n+3} at 1.5 u is at least gamma_{n+5} at u for every n >= 1: the bound of the other
# float32 stores (encoding.distance_bound), at this unit roundoff, covers it (docs/sqlite.md).
UNIT_ROUNDOFF = 1.5 * U32


def connect(
    path: str | None = None, timeout: float = 5.0, chunk_size: int = 128, threads: int | None = None
) -> SqliteStore:
    """path: the database file (ending .db, .sqlite or .sqlite3, or an existing file) or a folder to keep
        vecgpt.db in (`--store`); timeout: seconds to wait for another process's write lock before saying the file is
        locked; chunk_size: rows per vec0 chunk of a new table (a multiple of 8; smaller chunks make a KNN that returns
        thousands of rows cheaper, docs/sqlite.md); threads: KNN statements run at once, each on its thread's connection,
    and a model's large scan split by id range over them (default: the machine's cores)."""
    if chunk_size < 8 or chunk_size % 8:
        raise VecgptError(f"[store] chunk_size must be a multiple of 8 (sqlite-vec's), not {chunk_size}")
    return SqliteStore(path, timeout, chunk_size, threads or os.cpu_count() or 1)
