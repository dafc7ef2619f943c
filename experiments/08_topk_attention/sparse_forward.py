"""GPT-2 over a batch of equal-length windows, each query attending to the keys a selector keeps.

The functions are vecgpt.reference's (layer norm, linear, feed forward, causal mask, softmax), run on [B, C, d]
with the heads as an axis. A selector gets one layer's scores [B, H, m, C] (q.k / sqrt(hd) plus the causal mask,
for the queries at positions `qpos` [m]), the unscaled queries [B, H, m, hd] and keys [B, H, C, hd], and returns
which keys each query keeps [B, H, m, C], its own key always among them. `policy_keep(Policy(...))` keeps
vecgpt.policy.Policy.kept's set (reference.keep: a test checks the logits against `Reference(policy=...)`), None
keeps every key.

Attention is causal, so the query at position p of a window reads exactly what a text of its first p + 1 tokens
reads (its position's keys and queries, its policy's choices): one window gives a step at each context length up
to its own (`hidden_at`'s positions), and the last layer computes only those positions' queries.
"""

from __future__ import annotations

import math

import numpy as np

from vecgpt.policy import Policy
from vecgpt.reference import causal_mask, feed_forward, layer_norm, linear, softmax


def own_keys(qpos, n):  # [m, n]: each query's own position
    return np.arange(n) == np.asarray(qpos)[:, None]


def earlier_only(scores, qpos):  # [..., m, n] -> the same with each query's own key masked out too
    return np.where(own_keys(qpos, scores.shape[-1]), -np.inf, scores)


def top_k_keep(earlier, k):  # [..., m, n] scores of the candidate keys only (-inf elsewhere) -> each row's k best
    if k >= earlier.shape[-1] - 1:
        return np.isfinite(earlier)
    kth = -np.partition(-earlier, k - 1, axis=-1)[..., k - 1 : k]  # each row's k-th best (-inf: fewer than k)
    return (earlier >= kth) & np.isfinite(earlier)


def spans(policy: Policy, qpos, n):
    """Per query position i [m]: the keys always kept (the sinks, the window, its own) and those the policy
    chooses between (Policy.middle) -> two bool [m, n]."""
    j, i = np.arange(n), np.asarray(qpos)[:, None]
    a = np.minimum(policy.sinks or 0, i)
    b = np.maximum(a, i - (policy.window or 0))
    return (j < a) | ((j >= b) & (j <= i)), (j >= a) & (j < b)


def kept_mask(scores, qpos, policy: Policy):
    """Policy.kept over a batch: scores [..., m, n] scaled (and causally masked) -> keep [..., m, n]. Top-k keeps
    the k best between by a partition (ties at the k-th, which float64 scores do not have here, would keep more
    than Policy.kept's stable sort); the threshold every key between within beta of their best."""
    always, middle = spans(policy, qpos, scores.shape[-1])
    between = np.where(middle, scores, -np.inf)
    if policy.top_k is not None:
        return always | top_k_keep(between, policy.top_k)
    if policy.threshold is not None:
        return always | (middle & (between >= between.max(axis=-1, keepdims=True) - policy.threshold))
    return always | np.zeros(scores.shape, bool)  # sinks and a window alone


def policy_keep(policy: Policy):
    """Selector: each query's own key and the earlier keys its policy keeps (reference.keep)."""

    def keep(scores, q, key, layer, qpos):
        return kept_mask(scores, qpos, policy) if policy.active else np.isfinite(scores) | own_keys(qpos, key.shape[2])

    return keep


def exact_top_k(k):
    """Selector: each query's own key and its k best earlier keys by q.k (reference.keep_top_k)."""
    return policy_keep(Policy(top_k=k))


def hidden_at(params, hp, windows, positions=None, keep=None, record=None):
    """ln_f(x) at the query positions [P] (ascending; default: the last) of each window [B, C] -> [B, P, d].

    keep: a selector (None: every key). record: a dict that receives, per layer at those positions, "scores"
    ([B, H, P, C], scaled and masked) and "weights" where keep is None, else "kept" ([B, H, P, C])."""
    windows = np.asarray(windows)
    b, c = windows.shape
    positions = np.asarray([c - 1] if positions is None else positions)
    x = params["wte"]["weight"][windows] + params["wpe"]["weight"][:c]  # [B, C, d]
    mask = causal_mask(c, c, x.dtype)
    for layer, block in enumerate(params["h"]):
        rows = positions if layer == hp.n_layer - 1 else np.arange(c)
        a = layer_norm(x, **block["ln_1"], eps=hp.eps)
        x = x if len(rows) == x.shape[1] else x[:, rows]
        x = x + attend(a, block["attn"], hp.n_head, mask[rows], rows, (keep, layer, record, positions))
        ff = feed_forward(layer_norm(x, **block["ln_2"], eps=hp.eps).reshape(-1, x.shape[-1]), **block["mlp"])
        x = x + ff.reshape(x.shape)
    return layer_norm(x, **params["ln_f"], eps=hp.eps)


def forward(params, hp, windows, keep=None, record=None):
    """Next-token logits after each window [B, C] -> [B, n_vocab] (float64 where params are)."""
    last = hidden_at(params, hp, windows, None, keep, record)[:, -1]
    return linear(last, params["wte"]["weight"].T, 0)


def attend(a, attn, n_head, mask, rows, how):  # [B, n, d] -> [B, m, d] for the queries at positions rows [m]
    keep, layer, record, positions = how
    b, n, d = a.shape
    hd = d // n_head
    qkv = linear(a.reshape(b * n, d), **attn["c_attn"]).reshape(b, n, 3, n_head, hd)
    q, k, v = (np.ascontiguousarray(qkv[:, :, i].transpose(0, 2, 1, 3)) for i in range(3))  # [B, H, n, hd]
    q = q[:, :, rows]
    scores = q @ np.ascontiguousarray(k.transpose(0, 1, 3, 2)) / math.sqrt(hd) + mask  # [B, H, m, n]
    at = np.searchsorted(rows, positions)  # the recorded positions' rows
    if keep is not None:
        kept = keep(scores, q, k, layer, rows)
        if record is not None:
            record.setdefault("kept", []).append(kept[:, :, at])
        scores = np.where(kept, scores, -np.inf)
    elif record is not None:
        record.setdefault("scores", []).append(scores[:, :, at])
    w = softmax(scores)
    if keep is None and record is not None:
        record.setdefault("weights", []).append(w[:, :, at])
    heads = (w @ v).transpose(0, 2, 1, 3).reshape(b * len(rows), d)
    return linear(heads, **attn["c_proj"]).reshape(b, len(rows), d)
