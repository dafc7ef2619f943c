"""A Llama-family model over a batch of equal-length windows, each query attending to the keys a selector keeps:
sparse_forward's hidden_at for the family of vecgpt.reference_llama (RMSNorm, rotary q and k, SwiGLU, grouped-query
attention), run on [B, C, d] with the heads as an axis.

Grouped-query attention: each query head reads its key head's keys (families.key_head: consecutive query heads share
one), so the selector sees one row of scores per query head [B, H, m, C] and each query head keeps its own set, as
the engine's and LlamaReference(policy=...)'s do (a test checks the logits against the latter). Kept keys are
counted per query head; `union_kept` counts what a key head's group keeps together.
"""

from __future__ import annotations

import math

import numpy as np

from vecgpt.reference_llama import causal_mask, inv_freq, linear, rms_norm, softmax, swiglu


def rotate(x, at, freq):  # [..., n, hd] -> [..., n, hd]: reference_llama.rotary over leading axes
    angle = at[:, None] * freq[None, :]  # [n, hd / 2]
    cos, sin = np.cos(angle).astype(x.dtype), np.sin(angle).astype(x.dtype)
    x1, x2 = np.split(x, 2, axis=-1)
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def heads(x, n, hd):  # [B, C, n * hd] -> [B, n, C, hd]
    b, c, _ = x.shape
    return np.ascontiguousarray(x.reshape(b, c, n, hd).transpose(0, 2, 1, 3))


def hidden_at(params, hp, windows, positions=None, keep=None, record=None):
    """norm(x) at the query positions [P] (ascending; default: the last) of each window [B, C] -> [B, P, d], as
    sparse_forward.hidden_at (its keep and record), for params nested as LlamaModel.params."""
    windows = np.asarray(windows)
    body, (_, c) = params["model"], windows.shape
    positions = np.asarray([c - 1] if positions is None else positions)
    x = body["embed_tokens"]["weight"][windows]  # [B, C, d]
    mask, freq = causal_mask(c, c, x.dtype), inv_freq(hp.head_dim, hp.rope_theta, hp.scaling)
    for layer, block in enumerate(body["layers"]):
        rows = positions if layer == hp.n_layer - 1 else np.arange(c)
        a = rms_norm(x, block["input_layernorm"]["weight"], hp.eps)
        x = x if len(rows) == x.shape[1] else x[:, rows]
        x = x + attend(a, block["self_attn"], hp, freq, mask[rows], rows, (keep, layer, record, positions))
        x = x + swiglu(rms_norm(x, block["post_attention_layernorm"]["weight"], hp.eps), **block["mlp"])
    return rms_norm(x, body["norm"]["weight"], hp.eps)


def attend(a, attn, hp, freq, mask, rows, how):  # [B, n, d] -> [B, m, d] for the queries at positions rows [m]
    keep, layer, record, positions = how
    (b, n, _), hd, group = a.shape, hp.head_dim, hp.n_head // hp.n_kv_head
    at = np.arange(n, dtype=np.float64)
    q = rotate(heads(linear(a, **attn["q_proj"]), hp.n_head, hd)[:, :, rows], at[rows], freq)  # [B, H, m, hd]
    k = np.repeat(rotate(heads(linear(a, **attn["k_proj"]), hp.n_kv_head, hd), at, freq), group, axis=1)
    v = np.repeat(heads(linear(a, **attn["v_proj"]), hp.n_kv_head, hd), group, axis=1)  # [B, H, n, hd]
    scores = q @ np.ascontiguousarray(k.transpose(0, 1, 3, 2)) / math.sqrt(hd) + mask  # [B, H, m, n]
    seen = np.searchsorted(rows, positions)  # the recorded positions' rows
    if keep is not None:
        kept = keep(scores, q, k, layer, rows)
        if record is not None:
            record.setdefault("kept", []).append(kept[:, :, seen])
        scores = np.where(kept, scores, -np.inf)
    elif record is not None:
        record.setdefault("scores", []).append(scores[:, :, seen])
    w = softmax(scores)
    if keep is None and record is not None:
        record.setdefault("weights", []).append(w[:, :, seen])
    out = (w @ v).transpose(0, 2, 1, 3).reshape(b, len(rows), hp.n_head * hd)
    return linear(out, **attn["o_proj"])


def union_kept(kept, n_kv_head):  # [b, L, H, P, n] -> [b, L, n_kv_head, P]: keys a key head's group keeps together
    b, n_layer, n_head, p, n = kept.shape
    return kept.reshape(b, n_layer, n_kv_head, n_head // n_kv_head, p, n).any(axis=3).sum(-1)
