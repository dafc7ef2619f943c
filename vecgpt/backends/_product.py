"""A search of every row as one matrix product whose bits, row by row, are the row's product alone.

numpy's matmul (BLAS gemm), in calls of fixed shapes: the queries in chunks of at most 64, each padded with zero rows
to the next size in LADDER (so one query is a call of two, never BLAS's matrix-vector product, which sums in another
order); the matrix's rows in blocks of at most BLOCK, whole multiples of ALIGN, and the rows after the last whole
ALIGN with the rows before them, TAIL in all. Whether a row's bits are then its own, whatever shares its call, is
checked once per process for each block shape on this CPU and BLAS (`holds`); where it fails, the store keeps its
per-query kernel for that matrix, whatever the number of queries. docs/faiss.md, docs/memory.md.
"""

from __future__ import annotations

import threading

import numpy as np

LADDER = (2, 4, 8, 16, 24, 32, 48, 64)  # the query counts a call of BLAS is made with
CHECKED = (2, 3, 4, 8, 16, 17, 24, 32, 33, 48, 64)  # query counts the check compares with one alone
ALIGN, BLOCK, TAIL = 64, 4096, 1024  # rows of the matrix a call takes: see the module's docstring
VERDICTS: dict[tuple[str, int, int], bool] = {}  # (dtype, rows, dim) of a block -> whether the check passed
_LOCK = threading.Lock()


def call_size(m: int) -> int:
    return next(s for s in LADDER if s >= m)


def blocks(n: int) -> list[tuple[int, int]]:
    """The matrix's rows as the calls take them: (start, stop) of each block of whole ALIGNs, then of the TAIL rows
    ending at n (starting before 0 when n < TAIL: zero rows ahead) if n is not a whole number of ALIGNs."""
    head = n - n % ALIGN
    out = [(a, min(a + BLOCK, head)) for a in range(0, head, BLOCK)]
    return out + [(n - TAIL, n)] if head < n else out


def product(q: np.ndarray, x: np.ndarray) -> np.ndarray:
    """q [m, dim] . each row of x [n, dim] -> [m, n], in x's dtype (q is cast to it)."""
    q = np.asarray(q, x.dtype)
    out, head = np.empty((len(q), len(x)), x.dtype), len(x) - len(x) % ALIGN
    for a, b in blocks(len(x)):
        if b <= head:
            by_calls(q, x[a:b], out[:, a:b])
        else:  # the tail: only its rows past the last whole ALIGN are kept
            out[:, head:] = calls(q, rows(x, a, b))[:, head - b :]
    return out


def rows(x: np.ndarray, a: int, b: int) -> np.ndarray:
    """x[a:b], with zero rows for a's below 0."""
    return x[a:b] if a >= 0 else np.concatenate([np.zeros((-a, x.shape[1]), x.dtype), x[:b]])


def by_calls(q: np.ndarray, x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out [m, n] = q . x's rows, the queries in calls of LADDER's sizes (a short chunk padded with zero rows). A
    float32 call is x . q^T, which has OpenBLAS pack x as the product's wide operand; float64 the other way round:
    each the faster on the machine measured (docs/faiss.md)."""
    most = LADDER[-1]
    for a in range(0, len(q), most):
        part = q[a : a + most]
        padded = np.zeros((call_size(len(part)), x.shape[1]), x.dtype)
        padded[: len(part)] = part
        got = np.matmul(x, padded.T).T if x.dtype == np.float32 else np.matmul(padded, x.T)
        out[a : a + len(part)] = got[: len(part)]
    return out


def holds(x: np.ndarray) -> bool:
    """Whether `product` gives each row of x [n, dim] the bits of its query alone here: checked once a block shape,
    on x's own rows (the first of x, or the tail's)."""
    head = len(x) - len(x) % ALIGN
    for a, b in blocks(len(x)):
        key = (x.dtype.str, b - a, x.shape[1])
        if key not in VERDICTS:
            with _LOCK:
                if key not in VERDICTS:
                    VERDICTS[key] = check(rows(x, a, b) if b > head else x[: b - a])
        if not VERDICTS[key]:
            return False
    return True


def check(x: np.ndarray) -> bool:
    """Three random queries, each alone, against every query count in CHECKED, the three taking turns down the rows
    (so each appears at every position of every call size): every row bit for bit, in one block's calls."""
    q = np.random.default_rng(0).standard_normal((3, x.shape[1])).astype(x.dtype)
    alone = np.concatenate([calls(q[i : i + 1], x) for i in range(len(q))])
    turns = np.arange(CHECKED[-1]) % len(q)
    return all(np.array_equal(calls(q[turns[:m]], x), alone[turns[:m]]) for m in CHECKED)


def calls(q: np.ndarray, x: np.ndarray) -> np.ndarray:
    return by_calls(q, x, np.empty((len(q), len(x)), x.dtype))


def summary() -> str:
    """The block shapes checked so far and their verdicts, e.g. "blas at float32 3072x769; per-query at ..."."""
    if not VERDICTS:
        return "no shape checked yet"
    return "; ".join(
        f"{'blas' if ok else 'per-query'} at {np.dtype(dt).name} {n}x{dim}" for (dt, n, dim), ok in VERDICTS.items()
    )
