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

Query scaling. A store that computes distances in float32 returns dist with an error that scales
with the sizes summed, about eps * (M^2 + |q|^2), whatever y is; recovering y = (M^2 + |q|^2 -
dist) / 2 subtracts numbers of that size. M is the smallest length that leaves every pad real, the
largest row norm (M^2 = max_j |w_j|^2 + b_j^2), so M^2 adds as little as possible. The query is
then scaled, whole (bias coordinate included), by s = M/|q| rounded to a power of two:
q_s = s (x, 1, 0). Multiplying a float32 by a power of two is exact, so q_s is the same vector,
only of length near M, and
    y_j = (M^2 + |q_s|^2 - dist_j) / (2 s),   s read back from the sent query's bias coordinate,
whose error is about eps (M + |q_s|)^2 / (2 s) ~ 2 eps M |q| instead of eps (M^2 + |q|^2) / 2:
much smaller when M and |q| differ by a lot (docs/accuracy.md). Inner-product
documents are left unscaled (s = 1): a float32 inner product's error is already relative to
|q| M, and scaling by a power of two changes nothing there.

Attention keys have no M known in advance: the engine keeps |k|^2 for each stored key, scales each
head's query toward the largest stored key (s = K/|q|, a power of two) and decodes
q.k = (|q_s|^2 + |k|^2 - dist) / (2 s).

The per-search error bound (`search_bound`, `key_bound`), for outputs compared with float64 maths
on the float32 weights. A store summing n = dim terms in precision u (u = 2^-24 for float32,
2^-53 for float64) in ANY order, the plain sequential order being the worst, returns
    |dist' - dist| <= gamma_{n+3} * S,   gamma_k = k u / (1 - k u),
with S the sum of the absolute terms: S = |q_s - d|^2 <= (|q_s| + |d|)^2 for the direct form
sum (q_i - d_i)^2 (+3: the difference, the square and the float32 result), and the same bound for
the expanded form |q|^2 + |d|^2 - 2 q.d of FAISS/BLAS. The summation-order factor is the n in
gamma_n: a sequential sum of n terms has depth n - 1, pairwise sums log2 n, but rounding errors of
independent sign usually give about sqrt(n) u S; the bound takes the worst. Adding the float32
rounding of each pad (|d_j|^2 = M^2 (1 +- 2u32)), of the query (|w_j . dx| <= u32 M |x|) and of
the float64 decode (a few u64 (M^2 + |q_s|^2)):
    |y'_j - y_j| <= [gamma_{n+3} (M + |q_s|)^2 + 2.0001 u32 M^2 + 8 u64 (M^2 + |q_s|^2)] / (2 s)
                    + u32 M |x|
for l2, and gamma_{n+1} M |q| + u32 M |x| for ip (|sum q_i d_i| terms bounded by Cauchy-Schwarz).
For keys, with K_j = |k_j| (keys are stored in float32, so add u32 |q| K_j for the key rounding):
    |q.k' - q.k| <= [gamma_{n+3} (|q_s| + K_j)^2 + 8 u64 (|q_s|^2 + K_j^2)] / (2 s) + 2 u32 |q| K_j.
vecgpt.tolerance propagates these bounds through the layers to a logit tolerance.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

ENCODING_VERSION = 2  # 2: c_proj of attention stored per head (loading.matrices)
Metric = Literal["l2", "ip"]


U32, U64 = 2.0**-24, 2.0**-53  # unit roundoffs


def encode_rows(weight: np.ndarray, bias: np.ndarray | None, metric: Metric) -> tuple[np.ndarray, float]:
    """Documents for a [in, out] weight and its bias: ([out, in+2] or [out, in+1] float32, M^2)."""
    m2 = largest_norm2(weight, bias)
    return encode_block(weight, bias, metric, m2, slice(None)), m2


def float64_rows(weight: np.ndarray, bias: np.ndarray | None, rows: slice) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Those rows' weights [n, in] and biases [n] in float64 (as stored: rounded to float32 first), and each row's
    |document|^2 without its pad, |w|^2 + b^2 [n]."""
    w = np.asarray(weight[:, rows], np.float32).T.astype(np.float64)  # [n, in]
    b = np.zeros(len(w)) if bias is None else np.asarray(bias[rows], np.float32).astype(np.float64)  # [n]
    return w, b, np.einsum("ij,ij->i", w, w) + b * b


def largest_norm2(weight: np.ndarray, bias: np.ndarray | None) -> float:
    """M^2, the largest |row|^2 of the matrix's documents, a block of rows at a time (blocks())."""
    return max(float(float64_rows(weight, bias, rows)[2].max()) for rows in blocks(weight, slice(None)))


def encode_block(weight: np.ndarray, bias: np.ndarray | None, metric: Metric, m2: float, rows: slice) -> np.ndarray:
    """The documents of those rows, [n, in+2] or [n, in+1] float32, for the matrix's M^2, a block of rows at a time
    (blocks()): each row's document depends only on the row and M^2, so these are the whole matrix's, bit for bit."""
    parts = [_documents(weight, bias, metric, m2, block) for block in blocks(weight, rows)]
    return parts[0] if len(parts) == 1 else np.vstack(parts)


def _documents(weight, bias, metric: Metric, m2: float, rows: slice) -> np.ndarray:
    w, b, norms2 = float64_rows(weight, bias, rows)
    if metric == "ip":
        return np.hstack([w, b[:, None]]).astype(np.float32)
    pad = np.sqrt(np.maximum(m2 - norms2, 0.0))  # [n]
    return np.hstack([w, b[:, None], pad[:, None]]).astype(np.float32)


def blocks(weight: np.ndarray, rows: slice) -> list[slice]:
    """Those rows of a [in, out] weight as blocks whose float64 copies stay under BLOCK_BYTES."""
    start, stop, _ = rows.indices(weight.shape[1])
    step = max(1, BLOCK_BYTES // (8 * (weight.shape[0] + 2)))
    return [slice(a, min(a + step, stop)) for a in range(start, stop, step)] or [slice(start, start)]


# A block's float64 rows: under numpy's 4 MiB, above which it asks Linux for huge pages for an array. A load's
# big temporaries are written once, and a kernel that compacts memory to find a huge page at each first touch
# makes such a write many times slower.
BLOCK_BYTES = 1 << 21


def power_of_two(target: np.ndarray, norm: np.ndarray) -> np.ndarray:
    """2^round(log2(target / norm)), and 1 where either is 0 (or not finite), clipped to 2^-60..2^60.
    Rounded exactly, without a logarithm: with target / norm = f 2^e (f in [0.5, 1)), log2 is nearer e than e - 1
    when f >= 2^-1/2, an irrational number, so comparing f with its nearest double decides every case. One value
    each (a decode step's query) is done in Python floats, cheaper than numpy's ufuncs on one value, the same bits."""
    t, n = np.asarray(target, np.float64), np.asarray(norm, np.float64)
    if t.size == 1 and n.size == 1:
        return np.full(np.broadcast(t, n).shape, _power_of_two(float(t.flat[0]), float(n.flat[0])))
    ok = (np.minimum(t, n) > 0) & (np.maximum(t, n) < np.inf)  # NaN fails both tests
    if not ok.all():
        t, n = np.where(ok, t, 1.0), np.where(ok, n, 1.0)
    (ft, et), (fn, en) = np.frexp(t), np.frexp(n)  # the ratio of the fractions cannot overflow
    f, e = np.frexp(ft / fn)
    return np.ldexp(1.0, np.clip(e + et - en - (f < SQRT_HALF), -60, 60))


def _power_of_two(t: float, n: float) -> float:
    if not (0 < t < math.inf and 0 < n < math.inf):
        return 1.0
    (ft, et), (fn, en) = math.frexp(t), math.frexp(n)
    f, e = math.frexp(ft / fn)
    return math.ldexp(1.0, min(max(e + et - en - (f < SQRT_HALF), -60), 60))


SQRT_HALF = math.sqrt(0.5)  # the double nearest 2^-1/2 (sqrt is correctly rounded)


def encode_queries(x: np.ndarray, metric: Metric, m2: float | None = None) -> np.ndarray:
    """Queries for inputs x [m, in] as float32: s (x, 1, 0) for l2, (x, 1) for ip.
    s = sqrt(m2)/|q| rounded to a power of two (1 without m2); decoding reads s back."""
    x = np.asarray(x, np.float32)
    q = np.zeros((len(x), doc_dim(x.shape[1], metric)), np.float32)  # (x, 1, 0) or (x, 1)
    q[:, : x.shape[1]], q[:, x.shape[1]] = x, 1.0
    if metric == "ip" or m2 is None:
        return q
    s = power_of_two(np.sqrt(m2), np.sqrt(squared_norms(q)))  # [m]; m2 one value or one a query
    return q * s[:, None].astype(np.float32)  # exact: a power of two


def query_scale(queries: np.ndarray, metric: Metric) -> np.ndarray:
    """The s each query was sent with: its bias coordinate. [m]"""
    return np.asarray(queries[:, -2 if metric == "l2" else -1], np.float64)


def decode_dists(dists: np.ndarray, queries: np.ndarray, m2: float, metric: Metric) -> np.ndarray:
    """Matrix outputs y = w.x + b from distances [m, n] to the queries [m, dim] that produced them."""
    if metric == "ip":  # encode_queries sends (x, 1) as it is: s = 1
        return np.negative(dists, dtype=np.float64)
    y = np.subtract(m2 + squared_norms(queries)[:, None], dists, dtype=np.float64)  # m2: one value or [m, 1]
    y /= 2 * query_scale(queries, metric)[:, None]
    return y


def key_queries(q: np.ndarray, key_norms2: np.ndarray, metric: Metric) -> tuple[np.ndarray, np.ndarray]:
    """Attention queries [..., m, hd] as sent to keys of |k|^2 key_norms2 [..., n]: (float32 s q, s [..., m]).
    l2 scales toward the largest key; ip sends q as it is (s = 1). Leading axes: heads, each its own keys."""
    q32 = np.asarray(q, np.float32)
    if metric == "ip" or key_norms2.shape[-1] == 0:
        return q32, np.ones(q32.shape[:-1])
    s = power_of_two(np.sqrt(key_norms2.max(axis=-1))[..., None], np.sqrt(squared_norms(q32)))
    return q32 * s[..., None].astype(np.float32), s


def decode_key_dists(
    dists: np.ndarray, queries: np.ndarray, key_norms2: np.ndarray, metric: Metric, scale: np.ndarray | float = 1.0
) -> np.ndarray:
    """q.k from distances [..., m, n] between sent queries [..., m, hd] (s q, s = scale [..., m]) and keys
    whose |k|^2 is key_norms2 [..., m, n] or [n]."""
    s = np.asarray(scale, np.float64)[..., None]
    if metric == "ip":
        return np.divide(dists, -s, dtype=np.float64)  # -dists / s, in one pass
    return (squared_norms(queries)[..., None] + key_norms2 - np.asarray(dists, np.float64)) / (2 * s)


def squared_norms(v: np.ndarray) -> np.ndarray:
    """|v|^2 per row (the last axis), in float64, of the float32 vectors actually sent to the store."""
    v = np.asarray(v, np.float32).astype(np.float64)
    return np.einsum("...j,...j->...", v, v)


def doc_dim(n_in: int, metric: Metric) -> int:
    return n_in + (2 if metric == "l2" else 1)


def gamma(n: int, u: float) -> float:
    """Higham's gamma_n = n u / (1 - n u): the relative bound of a sum of n terms in any order."""
    return n * u / (1 - n * u)


def distance_bound(q_norm, d_norm, n: int, metric: Metric, u: float):
    """Bound on a store's |dist' - dist| between vectors of these norms in dimension n, precision u."""
    if metric == "ip":
        return gamma(n + 1, u) * q_norm * d_norm
    return gamma(n + 3, u) * (q_norm + d_norm) ** 2


def search_bound(x: np.ndarray, m2: float, metric: Metric, u: float, stored: float = U32) -> np.ndarray:
    """Bound on |y' - y| for every output of one matrix search, per input row of x [m, in] (see above).
    m2: the largest row norm squared (encode_rows' second value); u: the store's unit roundoff;
    stored: that of the vectors as sent and stored (float32; 0 for plain float64 maths on the weights)."""
    x = np.asarray(x, np.float64)
    m, n = np.sqrt(m2), doc_dim(x.shape[1], metric)
    q = encode_queries(x, metric, m2)
    q2, s = squared_norms(q), query_scale(q, metric)
    rounding = stored * m * np.sqrt(np.einsum("ij,ij->i", x, x))
    decode = 0.0 if metric == "ip" else 2.0001 * stored * m2 + 8 * U64 * (m2 + q2)  # pads, float64 arithmetic
    return (distance_bound(np.sqrt(q2), m, n, metric, u) + decode) / (2 * s if metric == "l2" else s) + rounding


def key_bound(
    q: np.ndarray,
    key_norms2: np.ndarray,
    metric: Metric,
    u: float,
    searched_norms2: np.ndarray | None = None,
    stored: float = U32,
) -> np.ndarray:
    """Bound on |q.k' - q.k| for queries q [m, hd] against keys of |k|^2 key_norms2 [n]: [m, n].
    The query is scaled toward the searched keys (searched_norms2, default all of them)."""
    qs, s = key_queries(q, key_norms2 if searched_norms2 is None else searched_norms2, metric)
    q_norm, qs2, k = np.linalg.norm(np.asarray(q, np.float64), axis=1), squared_norms(qs), np.sqrt(key_norms2)
    rounding = 2 * stored * q_norm[:, None] * k  # q and k rounded to float32
    dist = distance_bound(np.sqrt(qs2)[:, None], k[None], q.shape[1], metric, u)
    if metric == "ip":
        return dist / s[:, None] + rounding
    return (dist + 8 * U64 * (qs2[:, None] + key_norms2)) / (2 * s[:, None]) + rounding
