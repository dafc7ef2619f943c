"""GPT-2 over a batch of equal-length windows, each query attending to the keys a selector keeps.

The functions are vecgpt.reference's (layer norm, linear, feed forward, causal mask, softmax), run on [B, C, d]
with the heads as an axis. A selector gets one layer's scores [B, H, m, C] (q.k / sqrt(hd) plus the causal mask;
the last m positions' queries), the unscaled queries [B, H, m, hd] and keys [B, H, C, hd], and returns which keys
each query keeps [B, H, m, C], its own key always among them; `exact_top_k(K)` keeps vecgpt.reference.keep_top_k's set (a test checks the logits against
`Reference(attention_top_k=K)`), None keeps every key. The full-attention weights of the last query of every
window are recorded per layer (`probs`), for the mass a top-K set holds.
"""

from __future__ import annotations

import math

import numpy as np

from vecgpt.reference import causal_mask, feed_forward, layer_norm, linear, softmax


def own_keys(m, n):  # [m, n]: query i of the last m of n positions sits at n - m + i
    return np.arange(n) == np.arange(n - m, n)[:, None]


def earlier_only(scores):  # [..., m, n] -> the same with each query's own key masked out too
    return np.where(own_keys(*scores.shape[-2:]), -np.inf, scores)


def top_k_keep(earlier, k):  # [..., m, n] scores of earlier keys only -> keep mask of each row's k best
    if k >= earlier.shape[-1] - 1:
        return np.isfinite(earlier)
    kth = -np.partition(-earlier, k - 1, axis=-1)[..., k - 1 : k]  # each row's k-th best (-inf: fewer than k)
    return (earlier >= kth) & np.isfinite(earlier)


def exact_top_k(k):
    """Selector: each query's own key and its k best earlier keys by q.k (reference.keep_top_k)."""

    def keep(scores, q, key, layer):
        return top_k_keep(earlier_only(scores), k) | own_keys(*scores.shape[-2:])

    return keep


def forward(params, hp, windows, keep=None, record=None):
    """Next-token logits after each window [B, C] -> [B, n_vocab] (float64 where params are).

    keep: a selector (None: every key). record: a dict that receives "probs" (per layer, the last query's
    full-attention weights [B, H, C]) where keep is None, and "kept" (per layer, the last query's kept keys).
    The last layer reads only the last query (no later position needs the others)."""
    windows = np.asarray(windows)
    b, c = windows.shape
    x = params["wte"]["weight"][windows] + params["wpe"]["weight"][:c]  # [B, C, d]
    mask = causal_mask(c, c, x.dtype)
    for layer, block in enumerate(params["h"]):
        m = 1 if layer == hp.n_layer - 1 else c
        a = layer_norm(x, **block["ln_1"], eps=hp.eps)
        x = x[:, c - m :] + attend(a, block["attn"], hp.n_head, mask[c - m :], keep, layer, record)
        ff = feed_forward(layer_norm(x, **block["ln_2"], eps=hp.eps).reshape(b * m, -1), **block["mlp"])
        x = x + ff.reshape(x.shape)
    last = layer_norm(x[:, -1], **params["ln_f"], eps=hp.eps)  # [B, d]
    return linear(last, params["wte"]["weight"].T, 0)


def attend(a, attn, n_head, mask, keep, layer, record):  # [B, n, d] -> [B, m, d] for the last m = len(mask)
    b, n, d = a.shape
    m, hd = len(mask), d // n_head
    qkv = linear(a.reshape(b * n, d), **attn["c_attn"]).reshape(b, n, 3, n_head, hd)
    q, k, v = (np.ascontiguousarray(qkv[:, :, i].transpose(0, 2, 1, 3)) for i in range(3))  # [B, H, n, hd]
    q = q[:, :, n - m :]
    scores = q @ np.ascontiguousarray(k.transpose(0, 1, 3, 2)) / math.sqrt(hd) + mask  # [B, H, m, n]
    if keep is not None:
        kept = keep(scores, q, k, layer)
        scores = np.where(kept, scores, -np.inf)
        if record is not None:
            record.setdefault("kept", []).append(kept[:, :, -1])
    w = softmax(scores)
    if keep is None and record is not None:
        record.setdefault("probs", []).append(w[:, :, -1])
    heads = (w @ v).transpose(0, 2, 1, 3).reshape(b * m, d)
    return linear(heads, **attn["c_proj"]).reshape(b, m, d)


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
