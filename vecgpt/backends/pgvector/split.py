"""A large scan split by block range over several connections, so several backends (cores) share it.

One backend scans a table on one core, and a token's scans are memory-bound (docs/speed.md): a weight
table of more than SPLIT_PAGES pages is searched as `n` pieces, each the rows of a range of its pages
(`ctid` bounds: a TID Range Scan reads only those pages), the pieces sent at once on `n` connections.
Every row lies in exactly one range and the last range has no upper bound, so the pieces together are
the table whatever its size now; each row's distance is computed by pgvector as before. Merged
exactly: every row concatenated; the k nearest of the pieces' k nearest by (distance, id); a wide
collection's partial sums of a document whose part rows fell in two pieces added up (with two parts,
a + b as PostgreSQL's sum gives it; with more, another order: encoding.search_bound covers it).
"""

from __future__ import annotations

import numpy as np

SPLIT_PAGES = 128  # smaller tables go whole: a piece's statement and thread cost more than the pages


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


def merge(found: list[tuple[np.ndarray, np.ndarray]], k: int | None) -> tuple[np.ndarray, np.ndarray]:
    """One query's (ids, dists) from its pieces' (the same id twice: a wide document's partial sums)."""
    if len(found) <= 1:
        return found[0] if found else (np.zeros(0, np.int64), np.zeros(0))
    ids, dists = np.concatenate([f[0] for f in found]), np.concatenate([f[1] for f in found])
    if k is not None:
        best = np.lexsort((ids, dists))[:k]
        return ids[best], dists[best]
    unique, at = np.unique(ids, return_inverse=True)
    if len(unique) < len(ids):
        return unique, np.bincount(at, weights=dists, minlength=len(unique))
    return ids, dists
