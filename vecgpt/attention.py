"""Full-table attention and streaming (online-softmax) attention.

Full-table attention builds the score table S = q k^T / sqrt(hd) for every (query, key)
pair, takes a softmax along each row and multiplies by the values.  Streaming attention
reads the keys a tile at a time and keeps, per query,

    m   the running maximum of the scores read so far,
    l   the running total  sum_j exp(s_j - m),
    acc the running output sum_j exp(s_j - m) v_j,

and when a tile brings a larger maximum m' it rescales what it has by exp(m - m').
After the last tile acc / l equals softmax(S) v, without the table ever existing.

All arrays may carry leading batch (head) dimensions: q [..., n_q, hd], k, v [..., n_k, hd].
The tolerance of "equal" is stated in docs/attention.md and checked in tests/test_attention.py.
"""

from __future__ import annotations

import time
import tracemalloc

import numpy as np

from vecgpt.reference import softmax  # noqa: F401 (the plain form the streaming one must match: att.softmax)

DEFAULT_TILE = 8


def _check_tile(tile: int) -> None:
    if int(tile) != tile or tile < 1:
        raise ValueError(f"tile must be a positive integer, got {tile!r}")


# ----------------------------------------------------------------------------- streaming core


def _fold(m: np.ndarray, l: np.ndarray, acc: np.ndarray, s: np.ndarray, v: np.ndarray) -> None:
    """Fold one tile into the state, in place.

    m, l [..., r]; acc [..., r, hd]; s [..., r, t] scaled scores (-inf = masked; overwritten
    with exp(s - m_new)); v [..., t, hd].  A row with no finite score so far keeps m = -inf,
    l = 0, acc = 0; a row whose tile is all -inf keeps its state bit for bit (alpha = 1, p = 0).
    """
    m_new = np.maximum(m, s.max(axis=-1))  # [..., r]
    shift = np.where(m_new == -np.inf, 0.0, m_new)  # [..., r] avoid (-inf) - (-inf)
    alpha = np.exp(m - shift)  # [..., r] rescale factor, 0 on first read
    s -= shift[..., None]
    p = np.exp(s, out=s)  # [..., r, t] exp(s - m_new)
    l *= alpha
    l += p.sum(axis=-1)
    acc *= alpha[..., None]
    acc += p @ v  # [..., r, hd]
    m[...] = m_new


class RunningSoftmax:
    """Per-query running max m, running total l and output accumulator acc; fold scores a tile at a time.

    n_query may be an int or a tuple of leading dims (e.g. (n_head, n_query)).
    """

    def __init__(self, n_query, head_dim: int, dtype=np.float64):
        shape = (n_query,) if np.ndim(n_query) == 0 else tuple(n_query)
        self.dtype = np.dtype(dtype)
        self.m = np.full(shape, -np.inf, self.dtype)  # [n_query] running maximum
        self.l = np.zeros(shape, self.dtype)  # [n_query] running total
        self.acc = np.zeros(shape + (head_dim,), self.dtype)  # [n_query, head_dim] accumulator

    def update(self, scores: np.ndarray, values: np.ndarray, mask: np.ndarray | None = None) -> None:
        """scores [n_query, t] (already scaled, may be -inf); values [t, head_dim]; mask True = keep."""
        s = np.array(scores, dtype=self.dtype)  # [n_query, t] private copy
        if mask is not None:
            np.copyto(s, -np.inf, where=~np.asarray(mask, bool))
        self.update_rows(0, s, np.asarray(values, self.dtype))

    def update_rows(self, first: int, s: np.ndarray, values: np.ndarray) -> None:
        """Fold s [..., n_query - first, t] into queries first..n_query-1; s is overwritten."""
        _fold(self.m[..., first:], self.l[..., first:], self.acc[..., first:, :], s, values)

    def finish(self) -> np.ndarray:
        """[n_query, head_dim] = sum softmax(scores) * values; a query that saw no finite score gives 0."""
        out = np.zeros_like(self.acc)  # [n_query, head_dim]
        return np.divide(self.acc, self.l[..., None], out=out, where=self.l[..., None] > 0)


# ----------------------------------------------------------------------------- the two forms


def _mask_causal_rows(s: np.ndarray, first_pos: int, key0: int) -> None:
    """-inf where key key0+c lies after query first_pos+r, in s [..., r, t], in place.

    Only the first rows can see part of the tile; they form a small [d, t] block.
    """
    t = s.shape[-1]
    d = min(s.shape[-2], max(0, key0 + t - 1 - first_pos))  # rows that see part of the tile
    keep = key0 + np.arange(t) <= first_pos + np.arange(d)[:, None]  # [d, t]
    np.copyto(s[..., :d, :], -np.inf, where=~keep)


def full_attention(q, k, v, causal: bool = True, q_offset: int = 0) -> np.ndarray:
    """softmax(q k^T / sqrt(hd)) v with the whole [n_q, n_k] score table (per head).

    Query i sits at position q_offset + i and, when causal, sees keys 0..q_offset+i.
    Holds exactly one table: masking and softmax run in place.
    """
    n_q = q.shape[-2]
    s = q @ k.swapaxes(-1, -2)  # [..., n_q, n_k] the full table
    s *= q.shape[-1] ** -0.5  # python float: no upcast
    if causal:
        for i in range(n_q):  # row by row: no boolean table
            s[..., i, q_offset + i + 1 :] = -np.inf
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)  # [..., n_q, n_k] weights
    return s @ v  # [..., n_q, hd]


def streaming_attention(q, k, v, causal: bool = True, q_offset: int = 0, tile: int = DEFAULT_TILE) -> np.ndarray:
    """Same answer as full_attention, reading `tile` keys at a time; never builds [n_q, n_k].

    With causal, queries that cannot see a tile are skipped and only the <= tile rows on
    the diagonal are masked.
    """
    _check_tile(tile)
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = q.shape[-1] ** -0.5  # python float keeps the dtype
    state = RunningSoftmax(q.shape[:-1], v.shape[-1], np.result_type(q, k, v))
    for j in range(0, n_k, tile):
        first = max(0, j - q_offset) if causal else 0  # earlier queries see none of it
        if first >= n_q:
            break
        s = q[..., first:, :] @ k[..., j : j + tile, :].swapaxes(-1, -2)  # [..., n_q - first, t]
        s *= scale
        if causal:
            _mask_causal_rows(s, q_offset + first, j)
        state.update_rows(first, s, v[..., j : j + tile, :])
        del s  # free it before the next tile's
    return state.finish()


def streaming_decode(q, k, v, tile: int = DEFAULT_TILE) -> np.ndarray:
    """One query q [..., hd] against all stored keys k, v [..., n_k, hd] -> [..., hd]."""
    return streaming_attention(q[..., None, :], k, v, causal=False, tile=tile)[..., 0, :]


# ----------------------------------------------------------------------------- memory accounting


def memory_bytes(n_head, n_ctx, head_dim, n_query, tile, dtype) -> dict:
    """Exact bytes for one layer of attention (all heads at once).

    full       = the score table              n_head * n_query * n_ctx
    streaming  = tile scores + m + l + acc    n_head * n_query * (tile + 2 + head_dim)
    (both times the dtype's item size).  Also returned: the components, their ratio,
    `output` (the result both forms hand back) and `peak_full` / `peak_streaming`, the
    peak these numpy implementations allocate beyond their inputs (what tracemalloc sees):
      peak_full      = table + output                    (masking and softmax are in place)
      peak_streaming = streaming + p @ v product [n_query, hd] + 3 per-query vectors
                       (m_new, shift, alpha) alive while acc += p @ v runs
    """
    item = np.dtype(dtype).itemsize
    rows = n_head * n_query
    tile = min(tile, n_ctx)
    parts = {
        "table": rows * n_ctx * item,
        "tile_scores": rows * tile * item,
        "running_max": rows * item,
        "running_total": rows * item,
        "accumulator": rows * head_dim * item,
        "output": rows * head_dim * item,
    }
    full = parts["table"]
    streaming = parts["tile_scores"] + parts["running_max"] + parts["running_total"] + parts["accumulator"]
    scratch = rows * head_dim * item + 3 * rows * item
    return dict(
        parts,
        full=full,
        streaming=streaming,
        ratio=full / streaming,
        peak_full=full + parts["output"],
        peak_streaming=streaming + scratch,
    )


def random_qkv(n_head, n_ctx, head_dim, n_query, dtype, seed=0):
    """Random q [n_head, n_query, hd] (the last n_query positions) and k, v [n_head, n_ctx, hd]."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n_head, n_query, head_dim)).astype(dtype)
    k = rng.standard_normal((n_head, n_ctx, head_dim)).astype(dtype)
    v = rng.standard_normal((n_head, n_ctx, head_dim)).astype(dtype)
    return q, k, v


def measure(form, n_head, n_ctx, head_dim, n_query, tile, dtype, seed=0, trace=True) -> dict:
    """Run one layer of `form` ('full' | 'streaming' | 'fused'), causal, queries at the last
    n_query positions; return {'peak': bytes allocated beyond the inputs (tracemalloc), 'seconds'}."""
    q, k, v = random_qkv(n_head, n_ctx, head_dim, n_query, dtype, seed)
    off = n_ctx - n_query
    run = {
        "full": lambda: full_attention(q, k, v, True, off),
        "streaming": lambda: streaming_attention(q, k, v, True, off, tile),
        "fused": lambda: fused_attention(q, k, v, True, off, tile),
    }[form]
    if trace:
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    out = run()
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] - base if trace else None
    if trace:
        tracemalloc.stop()
    del out
    return {"peak": peak, "seconds": seconds}


# ----------------------------------------------------------------------------- walk-through


def softmax_walk(scores, tile: int = 1):
    """Fold 1-D scores tile by tile; return (steps, weights).

    Each step is a dict: positions (start, stop), tile_max, running_max, rescale
    (exp(m_old - m_new), None on the first read), running_total.  The weights are
    exp(s - m) / l from the final running maximum and total.
    """
    _check_tile(tile)
    s = np.asarray(scores, np.float64)  # [n]
    m, l, steps = -np.inf, 0.0, []
    for j in range(0, len(s), tile):
        part = s[j : j + tile]  # [t]
        m_new = max(m, part.max())
        rescale = None if m == -np.inf else float(np.exp(m - m_new))
        if m_new > -np.inf:
            l = l * (rescale or 0.0) + float(np.exp(part - m_new).sum())
        m = m_new
        steps.append(
            dict(
                positions=(j, j + len(part)),
                tile_max=float(part.max()),
                running_max=float(m),
                rescale=rescale,
                running_total=l,
            )
        )
    return steps, np.exp(s - m) / l


# ----------------------------------------------------------------------------- optional fused loop

try:  # numba is optional: pip install numba  (extra "fast")
    import numba

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover
    HAVE_NUMBA = False


if HAVE_NUMBA:

    @numba.njit(fastmath={"reassoc", "contract"}, cache=True)
    def _fused_row(q, k, v, h, i, stop, tile, out):  # pragma: no cover - compiled
        """One query row: dot products, online softmax and accumulation in one pass over keys."""
        hd = q.shape[2]
        zero = q[h, i, 0] * 0
        scale = zero + 1.0 / np.sqrt(hd)
        qi = q[h, i]  # [hd]
        s = np.empty(tile, q.dtype)  # [tile] scores of one tile
        acc = np.zeros(hd, q.dtype)  # [hd] output accumulator
        m, l = zero, zero
        for j0 in range(0, stop, tile):
            t = min(tile, stop - j0)
            m_new = m if j0 > 0 else -np.inf
            for c in range(t):
                kc = k[h, j0 + c]  # [hd]
                dot = zero
                for d in range(hd):
                    dot += qi[d] * kc[d]
                s[c] = dot * scale
                m_new = max(m_new, s[c])
            alpha = np.exp(m - m_new) if j0 > 0 else zero  # rescale what we have
            l *= alpha
            for d in range(hd):
                acc[d] *= alpha
            for c in range(t):
                w = np.exp(s[c] - m_new)
                l += w
                vc = v[h, j0 + c]  # [hd]
                for d in range(hd):
                    acc[d] += w * vc[d]
            m = m_new
        for d in range(hd):
            out[h, i, d] = acc[d] / l

    @numba.njit(parallel=True, cache=True)
    def _fused_kernel(q, k, v, causal, q_offset, tile, out):  # pragma: no cover - compiled
        n_head, n_q = q.shape[0], q.shape[1]
        n_k = k.shape[1]
        n_pair = (n_q + 1) // 2
        for task in numba.prange(n_head * n_pair):  # row p with row n_q-1-p:
            h, p = task // n_pair, task % n_pair  # equal causal work per task
            for r in range(2):
                i = p if r == 0 else n_q - 1 - p
                if r == 1 and i == p:
                    break
                stop = min(n_k, q_offset + i + 1) if causal else n_k
                _fused_row(q, k, v, h, i, stop, tile, out)


def fused_attention(q, k, v, causal: bool = True, q_offset: int = 0, tile: int = DEFAULT_TILE) -> np.ndarray:
    """Streaming attention as one compiled loop (numba): per query only `tile` scores + m, l, acc.

    q [n_head, n_q, hd] or [n_q, hd].  Needs numba; raises ImportError without it.
    """
    if not HAVE_NUMBA:
        raise ImportError("fused_attention needs numba (pip install numba)")
    _check_tile(tile)
    squeeze = q.ndim == 2
    q, k, v = (np.ascontiguousarray(a[None] if squeeze else a) for a in (q, k, v))
    out = np.zeros(q.shape[:-1] + (v.shape[-1],), np.result_type(q, k, v))  # [n_head, n_q, hd]
    _fused_kernel(q, k, v, causal, q_offset, tile, out)
    return out[0] if squeeze else out
