"""Choosing the next token, identically for the numpy reference and every store.

Candidates are ordered best first with ties going to the lowest token id. Sampling inverts the CDF of
softmax(logits / temperature) over the top k at a uniform number drawn from (seed, position), so a
resumed, retried or branched text draws at each position what an uninterrupted one would.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Candidates(NamedTuple):
    ids: np.ndarray  # [k] int64, best first
    logits: np.ndarray  # [k] float64, raw (before temperature)


def ordered(ids, logits) -> Candidates:
    ids, logits = np.asarray(ids, np.int64), np.asarray(logits, np.float64)
    order = np.lexsort((ids, -logits))
    return Candidates(ids[order], logits[order])


def top_k(logits: np.ndarray, k: int) -> Candidates:
    """The k largest logits of a full vocabulary row, best first, ties to the lowest id."""
    logits = np.asarray(logits, np.float64)
    k = min(k, len(logits))
    kth = np.partition(logits, len(logits) - k)[len(logits) - k]
    ids = np.flatnonzero(logits >= kth)  # keeps every tie at the boundary, ascending ids
    return Candidates(*(a[:k] for a in ordered(ids, logits[ids])))


def draw(seed: int, position: int) -> float:
    """The uniform number in [0, 1) that chooses the token at `position` of a text sampled with `seed`."""
    return float(np.random.default_rng([seed, position]).random())


def choose(c: Candidates, temperature: float, k: int, u: float | None) -> int:
    """Greedy at temperature 0; else the candidate where the CDF of the top k passes u (a `draw`)."""
    if temperature <= 0:
        return int(c.ids[0])
    z = c.logits[:k] / temperature
    p = np.exp(z - z.max())
    cdf = np.cumsum(p)
    i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    return int(c.ids[min(i, len(cdf) - 1)])
