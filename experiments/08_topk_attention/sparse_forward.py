"""GPT-2 over a batch of equal-length windows, each query attending to the keys a selector keeps.

The functions are vecgpt.reference's (layer norm, linear, feed forward, causal mask, softmax), run on [B, C, d]
with the heads as an axis. A selector gets one layer's scores [B, H, C, C] (q.k / sqrt(hd) plus the causal mask),
and the unscaled queries and keys [B, H, C, hd], and returns which keys each query keeps [B, H, C, C], its own key
always among them; `exact_top_k(K)` keeps vecgpt.reference.keep_top_k's set (a test checks the logits against
`Reference(attention_top_k=K)`), None keeps every key. The full-attention weights of the last query of every
window are recorded per layer (`probs`), for the mass a top-K set holds.
"""

from __future__ import annotations

import math

import numpy as np

from vecgpt.reference import causal_mask, feed_forward, layer_norm, linear, softmax


def earlier_only(scores):  # [..., C, C] -> the same with each query's own key masked out too
    c = scores.shape[-1]
    return np.where(np.eye(c, dtype=bool), -np.inf, scores)


def top_k_keep(earlier, k):  # [..., C, C] scores of earlier keys only -> keep mask of each row's k best
    c = earlier.shape[-1]
    if k >= c - 1:
        return np.isfinite(earlier)
    kth = -np.partition(-earlier, k - 1, axis=-1)[..., k - 1 : k]  # each row's k-th best (-inf: fewer than k)
    return (earlier >= kth) & np.isfinite(earlier)


def exact_top_k(k):
    """Selector: each query's own key and its k best earlier keys by q.k (reference.keep_top_k)."""

    def keep(scores, q, key, layer):
        return top_k_keep(earlier_only(scores), k) | np.eye(scores.shape[-1], dtype=bool)

    return keep


def forward(params, hp, windows, keep=None, record=None):
    """Next-token logits after each window [B, C] -> [B, n_vocab] (float64 where params are).

    keep: a selector (None: every key). record: a dict that receives "probs" (per layer, the last query's
    full-attention weights [B, H, C]) where keep is None, and "kept" (per layer, the last query's kept keys)."""
    windows = np.asarray(windows)
    b, c = windows.shape
    x = params["wte"]["weight"][windows] + params["wpe"]["weight"][:c]  # [B, C, d]
    mask = causal_mask(c, c, x.dtype)
    for layer, block in enumerate(params["h"]):
        a = layer_norm(x, **block["ln_1"], eps=hp.eps)
        x = x + attend(a, block["attn"], hp.n_head, mask, keep, layer, record)
        x = x + feed_forward(layer_norm(x, **block["ln_2"], eps=hp.eps).reshape(b * c, -1), **block["mlp"]).reshape(
            x.shape
        )
    last = layer_norm(x[:, -1], **params["ln_f"], eps=hp.eps)  # [B, d]
    return linear(last, params["wte"]["weight"].T, 0)


def attend(a, attn, n_head, mask, keep, layer, record):  # [B, C, d] -> [B, C, d]
    b, c, d = a.shape
    hd = d // n_head
    qkv = linear(a.reshape(b * c, d), **attn["c_attn"]).reshape(b, c, 3, n_head, hd)
    q, k, v = (np.ascontiguousarray(qkv[:, :, i].transpose(0, 2, 1, 3)) for i in range(3))  # [B, H, C, hd]
    scores = q @ np.ascontiguousarray(k.transpose(0, 1, 3, 2)) / math.sqrt(hd) + mask  # [B, H, C, C]
    if keep is not None:
        kept = keep(scores, q, k, layer)
        scores = np.where(kept, scores, -np.inf)
        if record is not None:
            record.setdefault("kept", []).append(kept[:, :, -1])
    w = softmax(scores)
    if keep is None and record is not None:
        record.setdefault("probs", []).append(w[:, :, -1])
    heads = (w @ v).transpose(0, 2, 1, 3).reshape(b * c, d)
    return linear(heads, **attn["c_proj"]).reshape(b, c, d)


def mass_held(probs, ks):
    """The share of full attention on the last query's own key and its K best earlier ones, for each K of ks.

    probs: per layer [B, H, C] -> [len(ks), layers, B, H]. The best earlier keys by q.k are those with the most
    weight (softmax keeps the order)."""
    out = []
    for p in probs:
        own, earlier = p[..., -1], -np.sort(-p[..., :-1], axis=-1)  # earlier weights, largest first
        cum = np.concatenate([np.zeros(p.shape[:-1] + (1,)), np.cumsum(earlier, axis=-1)], axis=-1)
        n = earlier.shape[-1]
        out.append([own + cum[..., n if k is None else min(k, n)] for k in ks])
    return np.asarray(out).transpose(1, 0, 2, 3)
