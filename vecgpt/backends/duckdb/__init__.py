"""DuckDB, embedded: one file holds the store (a table per collection, the model and text records), and every search
is one statement scoring its queries by DuckDB's core array functions over FLOAT[n] columns, exactly.

Environment: XDG_CACHE_HOME (the default file, $XDG_CACHE_HOME/vecgpt/duckdb/vecgpt.duckdb or
~/.cache/vecgpt/duckdb/vecgpt.duckdb). See docs/duckdb.md.

Modules: store (the file, collections, rows), searching (searches: a search_many's all-row searches one
statement), statements (tables, filters and search SQL, Arrow columns),
records (model and text records, the lock a text is open under).
"""

from __future__ import annotations

from vecgpt.backends.duckdb.store import DuckStore

# as fast as array_distance (a row is one chain of float32 multiply-adds either way), a fifth of its logit error, and
# within the engine's error bound where l2 is one rounding past it (docs/duckdb.md)
PREFERRED_METRIC = "ip"
# array_distance is the L2 distance rounded to float32, then squared: one rounding past the rule's sum, which
# 1.5 u covers (as sqlite-vec's; tolerance.unit_roundoff)
UNIT_ROUNDOFF = 1.5 * 2.0**-24
ONE_PROCESS = True  # DuckDB locks its file: a second process gets one line saying so

__all__ = ["DuckStore", "connect"]


def connect(path: str | None = None, threads: int = 0) -> DuckStore:
    """path: the store's file (--store); threads: DuckDB's threads (0: its default, one a core)."""
    return DuckStore(path, threads)
