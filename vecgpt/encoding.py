"""Matrix rows as vector-store documents, and store distances back into matrix outputs.

A weight matrix stored [in, out] (GPT-2's Conv1D layout) gives one document per output unit j:
the column w_j = weight[:, j] with its bias b_j.

Squared-L2 stores ("l2"). Each document is padded to one length M per matrix:
    d_j = (w_j, b_j, p_j),  p_j = sqrt(M^2 - |w_j|^2 - b_j^2)
and an input x becomes the query q = (x, 1, 0). Then
    |d_j - q|^2 = M^2 + |q|^2 - 2 (w_j.x + b_j)   so   y_j = (M^2 + |q|^2 - dist_j) / 2.
Every document has the same length, so ranking by distance is ranking by y: a top-k search is an
exact maximum-inner-product search, and a search returning all rows is the whole multiply.

Inner-product stores ("ip"): documents (w_j, b_j), queries (x, 1), and the store's distance is
the negated inner product, so y_j = -dist_j (adapters turn their native form into that).

Where float32 cancellation bites: a store that computes distances in float32 returns dist with
an absolute error of about 6e-8 * (M^2 + |q|^2), whatever y is. Recovering y subtracts two
numbers of that size, so outputs much smaller than M^2 + |q|^2 lose most of their digits. M is
therefore the smallest length that leaves every pad real, the largest row norm
(M^2 = max_j |w_j|^2 + b_j^2): one row gets pad 0 and M^2 adds as little as possible. |q|^2 is
the input's own size and cannot be avoided; the inner-product form has no such term, which is why
it is more precise on float32 stores. Distances stay in the store's precision (float64 where it
gives it) and every subtraction here happens in float64. Pads are rounded to float32 when
stored, so a document's length differs from M by about 6e-8 * p_j^2, far below the above.

Attention keys have no M known in advance: the engine keeps |k|^2 for each stored key and uses
q.k = (|q|^2 + |k|^2 - dist) / 2.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

ENCODING_VERSION = 1
Metric = Literal["l2", "ip"]


def encode_rows(weight: np.ndarray, bias: np.ndarray | None, metric: Metric) -> tuple[np.ndarray, float]:
    """Documents for a [in, out] weight and its bias: ([out, in+2] or [out, in+1] float32, M^2)."""
    w = np.asarray(weight, np.float32).T.astype(np.float64)  # [out, in]
    b = np.zeros(len(w)) if bias is None else np.asarray(bias, np.float32).astype(np.float64)  # [out]
    if metric == "ip":
        return np.hstack([w, b[:, None]]).astype(np.float32), 0.0
    norms2 = np.einsum("ij,ij->i", w, w) + b * b  # [out]
    m2 = float(norms2.max())
    pad = np.sqrt(np.maximum(m2 - norms2, 0.0))  # [out]
    return np.hstack([w, b[:, None], pad[:, None]]).astype(np.float32), m2


def encode_queries(x: np.ndarray, metric: Metric) -> np.ndarray:
    """Queries for inputs x [m, in]: (x, 1, 0) for l2, (x, 1) for ip, as float32."""
    x = np.asarray(x, np.float32)
    cols = [x, np.ones((len(x), 1), np.float32)] + ([np.zeros((len(x), 1), np.float32)] if metric == "l2" else [])
    return np.hstack(cols)


def decode_dists(dists: np.ndarray, queries: np.ndarray, m2: float, metric: Metric) -> np.ndarray:
    """Matrix outputs y = w.x + b from distances [m, n] to the queries [m, dim] that produced them."""
    dists = np.asarray(dists, np.float64)
    if metric == "ip":
        return -dists
    q2 = squared_norms(queries)  # [m]
    return (m2 + q2[:, None] - dists) / 2


def decode_key_dists(dists: np.ndarray, queries: np.ndarray, key_norms2: np.ndarray, metric: Metric) -> np.ndarray:
    """q.k from distances [m, n] between queries [m, hd] and keys whose |k|^2 is key_norms2 [m, n] or [n]."""
    dists = np.asarray(dists, np.float64)
    if metric == "ip":
        return -dists
    return (squared_norms(queries)[:, None] + key_norms2 - dists) / 2


def squared_norms(v: np.ndarray) -> np.ndarray:
    """|v|^2 per row, in float64, of the float32 vectors actually sent to the store."""
    v = np.asarray(v, np.float32).astype(np.float64)
    return np.einsum("ij,ij->i", v, v)


def doc_dim(n_in: int, metric: Metric) -> int:
    return n_in + (2 if metric == "l2" else 1)
