"""A bound R on the length of every key row a text of a model can write, per layer, from the weights alone.

A store that ranks by L2 ranks a head's keys by q.k when every key row has one length R: a row is stored as
(k, sqrt(R^2 - |k|^2)) and a query as (q, 0), so |q - row|^2 = |q|^2 + R^2 - 2 q.k (weight rows are padded the
same way, to M). R must be known before a text's first key: it is made when the model is loaded (the manifest's
`key_bound`). A key is k = W_k^T ln_1(x) + b_k with ln_1(x) = g * xhat + b, and |xhat| <= sqrt(d) (layer norm
divides by at least the standard deviation), so |k| <= ||diag(g) W_k||_2 sqrt(d) + |W_k^T b + b_k|. In layout three
a text's row is the document (W_q k, b_q . k) of a key: at most ||(W_q; b_q)||_2 times the key's bound.
"""

from __future__ import annotations

import numpy as np

MARGIN = 1.001  # the engine's keys come from decoded searches, a little off the exact product: room for that


def layer_bound(c_attn: dict, ln_1: dict, n_head: int, layout: str) -> float:
    """R for one layer: c_attn {"weight" [d, 3d], "bias" [3d]}, ln_1 {"weight", "bias"} [d]."""
    w, b = np.asarray(c_attn["weight"], np.float64), np.asarray(c_attn["bias"], np.float64)
    g, beta = np.asarray(ln_1["weight"], np.float64), np.asarray(ln_1["bias"], np.float64)
    d = w.shape[0]
    hd, out = d // n_head, []
    for h in range(n_head):
        cols = slice(d + h * hd, d + (h + 1) * hd)
        key = np.linalg.norm(g[:, None] * w[:, cols], 2) * np.sqrt(d) + np.linalg.norm(beta @ w[:, cols] + b[cols])
        if layout == "three":  # the document (W_q k, b_q . k): W_q's columns of head h with b_q below them
            q_cols = slice(h * hd, (h + 1) * hd)
            key *= np.linalg.norm(np.vstack([w[:, q_cols], b[None, q_cols]]), 2)
        out.append(key)
    return float(max(out) * MARGIN)


def padded(rows: np.ndarray, bound: float) -> np.ndarray:
    """Key rows [..., w] (float32, as stored) with the pad column that takes each to length `bound` [..., w + 1]."""
    rows = np.asarray(rows, np.float32)
    have = np.einsum("...j,...j->...", rows.astype(np.float64), rows.astype(np.float64))
    pad = np.sqrt(np.maximum(bound * bound - have, 0.0)).astype(np.float32)
    return np.concatenate([rows, pad[..., None]], axis=-1)
