"""Each row's k smallest entries, for the in-process stores' top-k: the token search's 50,257 distances a query.

A partition of every entry (numpy's argpartition, about 0.5 ms a row of 50,257 here) costs more than the search that
made them. The k-th smallest of an even sample of a row is at least the row's k-th smallest, so the entries at or
below it hold the row's k smallest: one comparison over the row, then a partition of a few thousand. Exact whatever
the values; the sample only sets how many entries pass.
"""

from __future__ import annotations

import numpy as np


def smallest(d: np.ndarray, k: int) -> np.ndarray:
    """Columns [m, k] of each row's k smallest entries of d [m, n], smallest first, ties to the lowest column
    (NaN after every number). k >= n: every column, so ordered."""
    m, n = d.shape
    if k >= n or not m:
        return np.lexsort((np.broadcast_to(np.arange(n), d.shape), d), axis=1)[:, :k]
    bound = sampled_bound(d, k)
    if bound is None:
        return np.stack([first_k(row, np.arange(n), k) for row in d])
    rows, cols = np.nonzero(d <= bound[:, None])
    at = np.searchsorted(rows, np.arange(m + 1))
    return np.stack([first_k(d[i, cols[a:b]], cols[a:b], k) for i, (a, b) in enumerate(zip(at[:-1], at[1:]))])


def sampled_bound(d: np.ndarray, k: int) -> np.ndarray | None:
    """Each row's k-th smallest of an even sample of about sqrt(n k) columns (the sample's partition and the entries
    that pass cost about alike), or None where a sample would hold most of the row or a bound is not a number."""
    n = d.shape[1]
    step = n // max(4 * k, int(np.sqrt(n * k)))
    if step < 4:
        return None
    bound = np.partition(d[:, ::step], k - 1, axis=1)[:, k - 1]
    return bound if not np.isnan(bound).any() else None


def first_k(values: np.ndarray, cols: np.ndarray, k: int) -> np.ndarray:
    """The k smallest of values (at ascending cols, at least k), smallest first, ties to the lowest column."""
    if len(values) > k:
        kth = np.partition(values, k - 1)[k - 1]
        if np.isnan(kth):  # fewer than k numbers: all of them, then the first NaNs
            return cols[np.lexsort((cols, values))][:k]
        below = values < kth
        keep = below | ((values == kth) & (np.cumsum(values == kth) <= k - below.sum()))
        values, cols = values[keep], cols[keep]
    return cols[np.lexsort((cols, values))]
