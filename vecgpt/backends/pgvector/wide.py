"""Documents wider than a page holds, as rows of parts: every part inline, no TOAST on a search.

A vector of more than PLAIN_MAX_DIM floats (the MLP's c_proj documents: 3,074) does not fit an 8 KB
page, so PostgreSQL moves it out of line, and a search then reads each row through the TOAST index:
768 such rows take longer than 3,072 inline rows of 770 floats (docs/pgvector.md). Such a collection's
document `id` is instead `parts` rows, ids `id * parts + p`, each holding `width` floats (the last
part padded with zeros, which add nothing to either distance); a search sums a document's partial
distances (split.merge; the k nearest: GROUP BY). A sum of the same terms in another order:
encoding.search_bound covers it.
"""

from __future__ import annotations

import numpy as np

PLAIN_MAX_DIM = 2000  # 4 * dim + 8 bytes plus a row header must fit in one 8 KB page


def parts_for(dim: int) -> int:
    return -(-dim // PLAIN_MAX_DIM)


def width(dim: int, parts: int) -> int:
    """Floats a row holds: dim itself, or dim split evenly (rounded up) over the parts."""
    return -(-dim // parts)


def split(vectors: np.ndarray, parts: int) -> np.ndarray:
    """[n, dim] -> [n * parts, width]: each vector's parts one after another, zero-padded."""
    n, dim = vectors.shape
    w = width(dim, parts)
    padded = np.zeros((n, parts * w), np.float32)
    padded[:, :dim] = vectors
    return padded.reshape(n * parts, w)


def row_ids(ids: np.ndarray, parts: int) -> np.ndarray:
    """Documents' ids -> their rows' ids, each document's parts one after another."""
    return (np.asarray(ids, np.int64)[:, None] * parts + np.arange(parts)).ravel()


def join(rows: np.ndarray, dim: int, parts: int) -> np.ndarray:
    """split's inverse: [n * parts, width] -> [n, dim]."""
    return rows.reshape(-1, parts * rows.shape[1])[:, :dim]
