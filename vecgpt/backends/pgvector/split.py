"""A large scan split by block range over several connections, so several backends (cores) share it.

One backend scans a table on one core, and a token's scans are memory-bound (docs/pgvector.md): a weight
table of at least SPLIT_PAGES pages is searched as `n` pieces, each the rows of a range of its pages
(`ctid` bounds: a TID Range Scan reads only those pages), the pieces sent at once on `n` connections.
Every row lies in exactly one range and the last range has no upper bound, so the pieces together are
the table whatever its size now; each row's distance is computed by pgvector as before. Merged
exactly: every row concatenated; the k nearest of the pieces' k nearest by (distance, id); a wide
collection's part distances added up by document wherever its part rows fell, smallest first (the same sum
whatever order the rows came in; encoding.search_bound covers any order).
"""

from __future__ import annotations

import numpy as np

# A table is split from SPLIT_PAGES pages; smaller ones go whole, as a piece's statement and thread cost more
# than the pages. A request's pieces (a layer's 12 per-head projections and 12 key searches, say) go to several
# connections once they add up to SHARE_PAGES. docs/pgvector.md, "Split scans".
SPLIT_PAGES = 512
SHARE_PAGES = 128


def block_ranges(pages: int, n: int) -> list[tuple[int, int | None]]:
    """[lo, hi) page ranges of about pages / n each; the last open-ended."""
    bounds = [round(j * pages / n) for j in range(n)]
    return [(lo, hi) for lo, hi in zip(bounds, bounds[1:])] + [(bounds[-1], None)]


def assign(costs: list[float], n: int) -> list[int]:
    """A connection for each piece: the costliest first, each to the least loaded (ties: the first)."""
    load, out = [0.0] * n, [0] * len(costs)
    for piece in sorted(range(len(costs)), key=lambda p: -costs[p]):
        out[piece] = load.index(min(load))
        load[out[piece]] += costs[piece]
    return out


def merge(found: list[tuple], k: int | None, parts: int = 1) -> tuple:
    """One query's (ids, dists, vectors or None) from its pieces'. A wide collection's (parts > 1) scan of every
    row gives each part row's distance under its document's id: those are added up, smallest first. Not in the
    order the rows came: a statement over several query vectors (texts sharing a round, vecgpt.stepper) may
    return a query's rows in another order than the statement for it alone, and with three parts or more the
    sum's bits would follow (tests/test_batch.py)."""
    if len(found) == 1 and (parts == 1 or k is not None):
        return found[0]
    if not found:
        return np.zeros(0, np.int64), np.zeros(0), None
    ids, dists = np.concatenate([f[0] for f in found]), np.concatenate([f[1] for f in found])
    rows = [f[2] for f in found if len(f[0])]  # a piece without rows has no vectors either
    vectors = np.concatenate(rows) if rows and all(r is not None for r in rows) else None
    if k is not None:
        best = np.lexsort((ids, dists))[:k]
        return ids[best], dists[best], None if vectors is None else vectors[best]
    if parts == 1:
        return ids, dists, vectors
    unique, at = np.unique(ids, return_inverse=True)
    order = np.lexsort((dists, at))  # a document's parts added smallest first, whatever order the rows came in
    return unique, np.bincount(at[order], weights=dists[order], minlength=len(unique)), None
