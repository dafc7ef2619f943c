"""GPT-2's forward pass in the order each layout computes it, every multiply's output handed to a hook.

reference.py is the plain maths. A store computes the same function in its layout's order
(vecgpt.config.LAYOUTS), and vecgpt.tolerance derives its error bound by running that order in float64
with `perturb` moving each multiply's output. The orders (perturb.order):
- "projected" (layout four, vecgpt.engine): each position's value projected by its head's rows of c_proj
  when it is computed, then attention sums softmax-weighted projections (`projected_heads`);
- "three" (layout three, vecgpt.three_rounds): projected values from x by the product W_v W_o, and the
  keys' documents scored against (x, 1) (`three_round_heads`, `value_output`, `query_rows`);
- "plain" (layout five, vecgpt.five_rounds, and numpy itself): heads side by side, then c_proj.
perturb sees .linear(x, weight, bias, y) and .scores(q, k, q @ k.T), its .top_k (None: every key), and per order .kept(v),
.project(v, weight, bias, y), .products / .product, .searched(n, m), .searched_scores(x1, docs, x1 @ docs.T).
"""

from __future__ import annotations

import math

import numpy as np

from vecgpt import reference
from vecgpt.policy import as_policy
from vecgpt.reference import causal_mask, gelu, layer_norm, softmax


def linear(x, weight, bias, perturb):  # [m, in], [in, out], [out] -> [m, out]
    return perturb.linear(x, weight, bias, reference.linear(x, weight, bias))


def feed_forward(x, c_fc, c_proj, perturb):  # [m, d] -> [m, d]
    return linear(gelu(linear(x, **c_fc, perturb=perturb)), **c_proj, perturb=perturb)


def attention(q, k, v, mask, perturb):  # [m, hd], [n, hd], [n, hd], [m, n] -> [m, hd]
    return softmax(kept(perturb.scores(q, k, q @ k.T) / math.sqrt(q.shape[-1]) + mask, perturb)) @ v


def kept(
    scores, perturb
):  # [m, n] -> [m, n]: under an attention policy (perturb.top_k: K or a Policy), reference.keep's
    policy = as_policy(getattr(perturb, "top_k", None))
    return reference.keep(scores, policy) if policy.active else scores


def mha(x, c_attn, c_proj, n_head, cache, perturb):  # [m, d] -> [m, d]; cache: "k", "v" [n, d], "pv", "doc"
    q, k, v = np.split(linear(x, **c_attn, perturb=perturb), 3, axis=-1)  # [m, d] each
    v = perturb.kept(v)  # values as a text keeps them (layout "five": float32)
    cache["k"], cache["v"] = np.concatenate([cache["k"], k]), np.concatenate([cache["v"], v])  # [n, d]
    mask = causal_mask(len(x), len(cache["k"]), x.dtype)  # [m, n]
    return HEADS[perturb.order](x, q, c_attn, c_proj, n_head, cache, mask, perturb)


def plain_heads(x, q, c_attn, c_proj, n_head, cache, mask, perturb):  # [m, d] -> [m, d]; reference.mha's order
    heads = [
        attention(qh, kh, vh, mask, perturb)
        for qh, kh, vh in zip(*(np.split(a, n_head, axis=-1) for a in (q, cache["k"], cache["v"])))
    ]  # n_head x [m, hd]
    return linear(np.hstack(heads), **c_proj, perturb=perturb)  # [m, d]


def projected_heads(x, q, c_attn, c_proj, n_head, cache, mask, perturb):  # [m, d] -> [m, d]
    """mha's result in the engine's order: each position's value projected by its head's rows of c_proj when it is
    computed (cache "pv" [n, H, d]; the bias rides with head 0), then attention sums softmax-weighted projections."""
    hd, new = q.shape[1] // n_head, len(cache["v"]) - len(cache.get("pv", ()))
    heads = np.split(cache["v"][-new:], n_head, axis=-1)  # H x [new, hd]
    rows = [(c_proj["weight"][h * hd : (h + 1) * hd], c_proj["bias"] if h == 0 else 0) for h in range(n_head)]
    pv = np.stack([perturb.project(vh, w, b, vh @ w + b) for vh, (w, b) in zip(heads, rows)], axis=1)
    cache["pv"] = pv if new == len(cache["v"]) else np.concatenate([cache["pv"], pv])  # [n, H, d]
    qs, ks = np.split(q, n_head, axis=-1), np.split(cache["k"], n_head, axis=-1)
    return sum(attention(qh, kh, cache["pv"][:, h], mask, perturb) for h, (qh, kh) in enumerate(zip(qs, ks)))


def three_round_heads(x, q, c_attn, c_proj, n_head, cache, mask, perturb):  # [m, d] -> [m, d]
    """mha's result in vecgpt.three_rounds' order: each position's projected values from x by W_v W_o (cache "pv"
    [n, H, d]), its keys' documents (W_q k, b_q . k) (cache "doc" [n, H, d + 1]); the searched keys
    (perturb.searched) scored as (x, 1) . document, the later ones as q . k, as the engine scores them."""
    m, hd = len(x), q.shape[1] // n_head
    new = {"pv": [], "doc": []}
    for h, k in enumerate(np.split(cache["k"][-m:], n_head, axis=-1)):
        vo, qk = perturb.products(c_attn, c_proj, n_head, h)
        new["pv"].append(perturb.product(x, vo["weight"], vo["bias"], x @ vo["weight"] + vo["bias"]))
        new["doc"].append(perturb.linear(k, qk["weight"], 0, k @ qk["weight"]))
    for name, rows in new.items():
        cache[name] = np.concatenate([cache[name], np.stack(rows, 1)]) if name in cache else np.stack(rows, 1)
    x1, end, out = np.hstack([x, np.ones((m, 1))]), perturb.searched(len(cache["k"]), m), 0
    for h, (qh, kh) in enumerate(zip(np.split(q, n_head, axis=-1), np.split(cache["k"], n_head, axis=-1))):
        doc = cache["doc"][:end, h]
        far = perturb.searched_scores(x1, doc, x1 @ doc.T) if end else np.zeros((m, 0))
        scores = np.hstack([far, perturb.scores(qh, kh, qh @ kh.T)[:, end:]])
        out = out + softmax(kept(scores / math.sqrt(hd) + mask, perturb)) @ cache["pv"][:, h]
    return out


HEADS = {"plain": plain_heads, "projected": projected_heads, "three": three_round_heads}


def value_output(c_attn, c_proj, n_head, h) -> dict:  # {"weight" [d, d], "bias" [d]}
    """Head h's value, then its rows of c_proj, as one matrix made in float64: x (W_v W_o) + b_v W_o, with
    c_proj's bias on head 0 (as projected_heads carries it)."""
    d = c_proj["weight"].shape[1]
    hd = d // n_head
    cols, rows = slice(2 * d + h * hd, 2 * d + (h + 1) * hd), slice(h * hd, (h + 1) * hd)
    w_v, b_v, w_o = (
        np.asarray(a, np.float64) for a in (c_attn["weight"][:, cols], c_attn["bias"][cols], c_proj["weight"][rows])
    )
    return {"weight": w_v @ w_o, "bias": b_v @ w_o + (np.asarray(c_proj["bias"], np.float64) if h == 0 else 0)}


def query_rows(c_attn, n_head, h) -> dict:  # {"weight" [hd, d + 1]}
    """What takes a key k of head h to its document (W_q k, b_q . k): for any x, q . k = (x, 1) . document."""
    hd = c_attn["weight"].shape[0] // n_head
    cols = slice(h * hd, (h + 1) * hd)
    return {"weight": np.vstack([c_attn["weight"][:, cols], c_attn["bias"][None, cols]]).T}


def transformer_block(x, ln_1, attn, ln_2, mlp, n_head, eps, cache, perturb):  # [m, d] -> [m, d]
    x = x + mha(layer_norm(x, **ln_1, eps=eps), **attn, n_head=n_head, cache=cache, perturb=perturb)
    return x + feed_forward(layer_norm(x, **ln_2, eps=eps), **mlp, perturb=perturb)


def hidden(ids, start, wte, wpe, h, ln_f, n_head, eps, caches, perturb):  # [m] -> [m, d], ln_f(x)
    x = wte["weight"][ids] + wpe["weight"][start : start + len(ids)]  # [m, d]
    for block, cache in zip(h, caches):
        x = transformer_block(x, **block, n_head=n_head, eps=eps, cache=cache, perturb=perturb)
    return layer_norm(x, **ln_f, eps=eps)


class InOrder(reference.Reference):
    """The reference's KV cache, read in perturb.order's order with every multiply's output through perturb."""

    def __init__(self, model, perturb, dtype=np.float64):
        super().__init__(model, dtype, getattr(perturb, "top_k", None))
        self.perturb = perturb

    def hidden(self, ids) -> np.ndarray:  # [m] -> [m, d]
        hp, ids = self.hparams, np.asarray(ids, dtype=np.int64)
        return hidden(
            ids, self.position, **self.params, n_head=hp.n_head, eps=hp.eps, caches=self.caches, perturb=self.perturb
        )

    def logits(self, ids) -> np.ndarray:  # [m] -> [m, n_vocab]
        return linear(self.hidden(ids), self.params["wte"]["weight"].T, 0, self.perturb)
