"""Milvus through pymilvus's MilvusClient: embedded Milvus Lite in the store's folder, or a Milvus server by URL.
A Milvus collection per vecgpt collection, FLAT index (exact), consistency Strong; manifests and text records in
the folder.

Environment: VECGPT_MILVUS_TOKEN (a server's token, user:password or an API key), XDG_CACHE_HOME (the default
folder, $XDG_CACHE_HOME/vecgpt/milvus or ~/.cache/vecgpt/milvus). See docs/milvus.md.

Modules: store (collections, rows, clones), search (searches, split by id range past Milvus's limit), requests (Milvus's limits and the splits that keep
requests inside them, filters as expressions, results as arrays), schema (a collection's fields and index), client
(Milvus Lite or a server, errors, collection names).
"""

from __future__ import annotations

from vecgpt.backends.milvus.requests import Limits
from vecgpt.backends.milvus.store import MilvusStore

PREFERRED_METRIC = (
    "ip"  # Milvus Lite's IP is one matrix product; its L2 forms every query-row difference (docs/milvus.md)
)

__all__ = ["Limits", "MilvusStore", "connect"]


def NETWORKED(uri: str | None = None, **_) -> bool:  # noqa: N802 (config.auto_layout: a flag or a function)
    """A Milvus server (an http URI) is behind a network; Milvus Lite runs in process."""
    return "://" in str(uri or "")


def ONE_PROCESS(uri: str | None = None, **_) -> bool:  # noqa: N802 (base.one_process: a flag or a function)
    """Milvus Lite serves one process a folder; a server (an http URI) any number."""
    return "://" not in str(uri or "")


def connect(path: str | None = None, uri: str | None = None, prefix: str = "vecgpt", timeout: float = 30.0):
    """path: the store's folder (manifests, text records and, without uri, Milvus Lite's files in milvus.db);
    uri: a Milvus server (http://host:19530; its token from VECGPT_MILVUS_TOKEN) or Milvus Lite's folder;
    prefix: the start of this store's collection names, so stores can share a server; timeout: seconds a
    request may take."""
    return MilvusStore(path, uri, prefix, timeout)
