"""Which earlier keys a query attends to: every one (full attention), or a policy (docs/topk-attention.md).

A policy always keeps the query's own key, the first `sinks` positions and the last `window` earlier ones
(StreamingLLM); between them it keeps the `top_k` best keys by q.k, or (`threshold` beta, AlayaDB's DIPR) every key
whose scaled score q.k / sqrt(hd) is within beta of the best one between them, or, with neither, none. numpy's
maths (reference.py) and the engine's searches (vecgpt.text_keys) both read it here: the engine asks the store for
exactly these keys, by a filter on positions and a top-k or range search.

A key dropped by a threshold has a weight at most e^-beta times the best key's, so the weight that n dropped keys
could have held is at most n e^-beta / (1 + n e^-beta) of the query's (`dropped_bound`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from vecgpt.errors import VecgptError


class Policy(NamedTuple):
    top_k: int | None = None  # K best keys between the sinks and the window
    threshold: float | None = None  # beta: every key between them within beta of their best (scaled score)
    sinks: int | None = None  # the first S positions, always kept
    window: int | None = None  # the last W earlier positions, always kept

    @property
    def active(self) -> bool:
        """Whether the policy can drop a key (else: full attention)."""
        return self != FULL

    def middle(self, i: int) -> tuple[int, int]:
        """The positions [a, b) of a query at position i that top-k or the threshold choose from."""
        a = min(self.sinks or 0, i)
        return a, max(a, i - (self.window or 0))

    def kept(self, scores: np.ndarray) -> np.ndarray:
        """The earlier keys a query at position i = len(scores) keeps, from their scaled scores [i] -> bool [i]."""
        i = len(scores)
        a, b = self.middle(i)
        keep = np.zeros(i, bool)
        keep[:a], keep[b:] = True, True
        between = scores[a:b]
        if len(between) and self.top_k is not None:
            keep[a + np.argsort(-between, kind="stable")[: self.top_k]] = True
        elif len(between) and self.threshold is not None:
            keep[a:b] = between >= between.max() - self.threshold
        return keep


FULL = (None, None, None, None)  # a policy that keeps every key (Policy(), as a plain tuple: compared at C speed)
SETTINGS = ("attention_top_k", "attention_threshold", "attention_sinks", "attention_window")  # a text's record's


def settings(policy: Policy) -> dict:
    """A policy as a text's record keeps it."""
    return dict(zip(SETTINGS, policy))


def from_settings(record_settings: dict) -> Policy:
    """A text's policy from its record (a record from before a field: that field unset)."""
    return Policy(*(record_settings.get(name) for name in SETTINGS))


def as_policy(policy) -> Policy:
    """A Policy, or top-k's K alone (None: every key)."""
    return policy if isinstance(policy, Policy) else Policy(top_k=policy)


def dropped_bound(beta: float, dropped: np.ndarray) -> np.ndarray:
    """The share of a query's weight that `dropped` keys, each scored beta below the best kept one or lower, could
    have held at most: n e^-beta / (1 + n e^-beta)."""
    worst = np.asarray(dropped, np.float64) * math.exp(-beta)
    return worst / (1 + worst)


def check(policy: Policy, n_ctx: int) -> Policy:
    """A policy as given, or a one-line refusal before any search."""
    k, beta, s, w = policy
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise VecgptError(f"attention_top_k must be 1 or more keys (unset: every key), not {k!r}")
    if k is not None and k >= n_ctx:
        raise VecgptError(
            f"attention_top_k = {k} is more keys than a query can have: the context holds {n_ctx} positions, so at "
            f"most {n_ctx - 1} earlier keys; give fewer, or unset it for every key"
        )
    if beta is not None and (isinstance(beta, bool) or not isinstance(beta, (int, float)) or not beta >= 0):
        raise VecgptError(f"attention_threshold must be a finite number 0 or more (a score gap), not {beta!r}")
    if beta is not None and not math.isfinite(beta):
        raise VecgptError(f"attention_threshold must be finite (unset it for every key), not {beta!r}")
    if k is not None and beta is not None:
        raise VecgptError("give attention_top_k or attention_threshold, not both: each chooses the keys between")
    for name, v in (("attention_sinks", s), ("attention_window", w)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n_ctx):
            raise VecgptError(f"{name} must be a number of positions from 0 to {n_ctx - 1} (the context), not {v!r}")
    return policy
