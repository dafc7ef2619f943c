"""Grouped-query attention's softmax for the Llama family (vecgpt.llama_rounds).

A text keeps n_kv_head heads of keys (its Session's `hp` counts those). Query heads kv * group .. kv * group + group - 1
read key head kv (families.key_head): the key search is text_keys' with each key head's group of queries stacked
(text_keys.stacked; a search by head counts a request per key head, n_kv_head a layer), its q.k laid out again by
query head [n_head, m, n]; here each query head's softmax multiplies its key head's values.
"""

from __future__ import annotations

import math

import numpy as np

from vecgpt.attend import softmax_in_place


def attend(s, searched, own, start, layer, group) -> np.ndarray:  # -> [H, m, hd]
    """One text's grouped-query attention (reference_llama.attention's maths): each query head's softmax over its
    earlier keys' q.k (-inf where a policy left one out) and its own, by 1 / sqrt(hd), times its key head's values."""
    n_head, m = own.shape
    n, rows, hd = start + m, np.arange(m), s.hp.head_dim
    scores = np.empty((n_head, m, n))
    scores[..., : n - 1] = searched
    scores[:, rows, start + rows] = own
    if m > 1:  # a block's later keys are masked
        np.copyto(scores, -np.inf, where=np.arange(n) > (start + rows)[:, None])
    raw = scores.copy() if s.capture is not None else None  # an inspection keeps q.k and the weights
    scores /= math.sqrt(hd)
    weights = softmax_in_place(scores)
    if raw is not None:
        s.capture.append((raw, weights.copy()))
    weights = weights.reshape(n_head // group, group * m, n)
    return (weights @ s.projected[layer, :, :n]).reshape(n_head, m, hd)
