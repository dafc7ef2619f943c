"""LanceDB, embedded: one Lance table per collection in a folder, searched by exact flat scans (a model's tables
through an index of one partition, which every search reads whole).

Environment: XDG_CACHE_HOME (the default folder, $XDG_CACHE_HOME/vecgpt/lancedb or
~/.cache/vecgpt/lancedb). See docs/lancedb.md.

Modules: store (collections, rows, compaction), search (searches: a table's filtered all-row searches one
query), table (a table's metadata and ids, its
read/write lock, filters as SQL).
"""

from __future__ import annotations

from collections.abc import Sequence

from vecgpt.backends.lancedb.store import LanceStore

__all__ = ["LanceStore", "connect"]


def connect(
    path: str | None = None,
    compact_every: int = 12,
    concurrent: bool = True,
    index_attrs: Sequence[str] = ("layer", "head"),
    index_rows: int = 2048,
    file_format: str = "legacy",
    flat_index: bool = True,
) -> LanceStore:
    """path: the store's folder; compact_every: writes to a table between compactions (0: never,
    except at the end of a load); concurrent: let the engine send a round's requests from threads;
    index_attrs: attributes given a bitmap index when a table of index_rows rows or more is compacted;
    file_format: Lance's file format for new tables ("legacy", "stable", "2.1"); flat_index: give every table but
    a text's an IVF_FLAT index of one partition when a load ends, and search it."""
    return LanceStore(path, compact_every, concurrent, index_attrs, index_rows, file_format, flat_index)
