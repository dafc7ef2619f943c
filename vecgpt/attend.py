"""Attention's softmax and weighted values for the texts of a step: softmax(q k^T / sqrt(hd)) v per head, with the
q.k of earlier keys from the store's key search and each query's own from memory (reference.attention's maths).

The texts reading one position (a decode step) are attended together: their score rows are laid side by side,
each padded with -inf to a length its own position sets (`padded`), so a row's max and sum run over the same
elements in the same order whether its text is alone or among others, and its bits never depend on company. A
block (a prompt's chunk) and a top-k query that drops keys are attended text by text.
"""

from __future__ import annotations

import math

import numpy as np

from vecgpt.text_keys import pruned

PAD = 64  # a decode step's score row is padded to a multiple of this many positions


def padded(n: int, n_ctx: int) -> int:
    """The length of the score row of a query at position n - 1: n rounded up to PAD (at most the context)."""
    return min(-(-n // PAD) * PAD, n_ctx)


def softmax_in_place(s: np.ndarray) -> np.ndarray:
    """reference.softmax over the last axis, the same operations, in s itself: a prompt block's score table is the
    largest array a read holds (12 heads at 1,024 positions: 100 MB), and reference.softmax makes two more."""
    s -= s.max(axis=-1, keepdims=True)
    s = np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return s


def attend(entries: list, layer: int, hd: int) -> list[np.ndarray]:
    """entries [(session, searched q.k [H, m, start + m - 1], own q.k [H, m], start)] -> each text's weighted
    values [H, m, w]: the decode steps of each padded length together, the rest one by one."""
    out: list = [None] * len(entries)
    together: dict[int, list[int]] = {}
    for j, (s, _, own, start) in enumerate(entries):
        if own.shape[1] == 1 and not pruned(s, start, 1):
            together.setdefault(padded(start + 1, s.hp.n_ctx), []).append(j)
        else:
            out[j] = alone(*entries[j], layer, hd)
    for width, js in together.items():
        for j, values in zip(js, decoding([entries[j] for j in js], width, layer, hd)):
            out[j] = values
    return out


def decoding(group: list, width: int, layer: int, hd: int) -> list[np.ndarray]:
    """Texts reading one position each, their rows padded to `width` -> each one's [H, 1, w]."""
    n_head = group[0][2].shape[0]
    scores = np.full((len(group), n_head, width), -np.inf)
    for t, (_, searched, own, start) in enumerate(group):
        scores[t, :, :start] = searched[:, 0]
        scores[t, :, start] = own[:, 0]
    raw = scores.copy() if any(s.capture is not None for s, *_ in group) else None  # an inspection keeps q.k
    scores /= math.sqrt(hd)
    weights = softmax_in_place(scores)
    out = []
    for t, (s, *_, start) in enumerate(group):
        if s.capture is not None:
            s.capture.append((raw[t][:, None, : start + 1], weights[t][:, None, : start + 1].copy()))
        n = start + 1  # the padding's weights are 0: its values are not read (a text's own length, as its row's)
        out.append(weights[t][:, None, :n] @ s.projected[layer, :, :n])  # [H, 1, n] @ [H, n, w]
    return out


def alone(s, searched, own, start, layer, hd):  # -> [H, m, w]
    """One text's attention: a block's queries (each sees the positions up to its own), or a top-k query."""
    n_head, m = own.shape
    n, rows = start + m, np.arange(m)
    if m == 1 and s.capture is None:
        return kept_values(s, searched, np.isfinite(searched[:, 0]), own, layer, hd)
    scores = np.empty((n_head, m, n))
    scores[..., : n - 1] = searched
    scores[:, rows, start + rows] = own
    if m > 1:  # a block's later keys are masked (the last column of its earlier queries was never written)
        np.copyto(scores, -np.inf, where=np.arange(n) > (start + rows)[:, None])
    raw = scores.copy() if s.capture is not None else None
    scores /= math.sqrt(hd)  # in place, as the softmax below: a block's table is the largest array a read holds
    weights = softmax_in_place(scores)
    if raw is not None:
        s.capture.append((raw, weights.copy()))
    return weights @ s.projected[layer, :, :n]


def kept_values(s, searched, kept, own, layer, hd):  # a query's kept earlier keys' q.k [H, 1, n - 1]
    """One query under an attention policy ([H, 1, w]): the softmax over its kept keys and its own, only their
    values read. Heads keep different positions, and under a threshold different numbers: a head's row is padded
    to the most any head kept with -inf, whose weight is 0, and its own key last."""
    n_head, n = searched.shape[0], searched.shape[-1] + 1
    counts = kept.sum(axis=1)
    order = np.argsort(~kept, axis=1, kind="stable")[:, : counts.max()]  # each head's kept positions first, ascending
    real = np.arange(order.shape[1]) < counts[:, None]
    pos = np.hstack([np.where(real, order, n - 1), np.full((n_head, 1), n - 1)])  # [H, K + 1], the own key last
    scores = np.where(real, np.take_along_axis(searched[:, 0], order, -1), -np.inf)
    scores = np.hstack([scores, own]) / math.sqrt(hd)  # [H, K + 1]
    weights = softmax_in_place(scores)
    values = s.projected[layer][np.arange(n_head)[:, None], pos]  # [H, K + 1, w]
    return weights[:, None] @ values
