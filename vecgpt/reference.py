"""The ordinary numpy GPT-2 forward pass with a KV cache: the yardstick for every store."""

from __future__ import annotations

import math

import numpy as np

from vecgpt.sampling import Candidates, top_k
from vecgpt.weights import Model


def gelu(x):  # GPT-2's tanh form ("gelu_new"); x * x * x, as x**3 calls pow() per element (far slower)
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * (x * x * x))))


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def layer_norm(x, weight, bias, eps):  # [m, d] -> [m, d]
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return weight * (x - mean) / np.sqrt(var + eps) + bias


def linear(x, weight, bias, perturb=None):  # [m, in], [in, out], [out] -> [m, out]
    y = x @ weight + bias
    return y if perturb is None else perturb.linear(x, weight, bias, y)


def feed_forward(x, c_fc, c_proj, perturb=None):  # [m, d] -> [m, d]; GPT-2's "mlp"
    return linear(gelu(linear(x, **c_fc, perturb=perturb)), **c_proj, perturb=perturb)


def attention(q, k, v, mask, perturb=None):  # [m, hd], [n, hd], [n, hd], [m, n] -> [m, hd]
    scores = q @ k.T if perturb is None else perturb.scores(q, k, q @ k.T)
    return softmax(scores / math.sqrt(q.shape[-1]) + mask) @ v


def causal_mask(m, n, dtype):  # query i of the last m sits at position n - m + i
    return np.triu(np.full((m, n), -np.inf, dtype), k=n - m + 1)


def mha(x, c_attn, c_proj, n_head, cache, perturb=None):  # [m, d] -> [m, d]; cache holds "k", "v" [n, d]
    q, k, v = np.split(linear(x, **c_attn, perturb=perturb), 3, axis=-1)  # [m, d] each
    v = v if perturb is None else perturb.kept(v)  # values as a text keeps them (layout "five": float32)
    cache["k"], cache["v"] = np.concatenate([cache["k"], k]), np.concatenate([cache["v"], v])  # [n, d]
    mask = causal_mask(len(x), len(cache["k"]), x.dtype)  # [m, n]
    if getattr(perturb, "layout", "four") == "three":
        return three_round_heads(x, q, c_attn, c_proj, n_head, cache, mask, perturb)
    if getattr(perturb, "project_heads", False):
        return projected_heads(q, c_proj, n_head, cache, mask, perturb)
    heads = [
        attention(qh, kh, vh, mask, perturb)
        for qh, kh, vh in zip(*(np.split(a, n_head, axis=-1) for a in (q, cache["k"], cache["v"])))
    ]  # n_head x [m, hd]
    return linear(np.hstack(heads), **c_proj, perturb=perturb)  # [m, d]


def projected_heads(q, c_proj, n_head, cache, mask, perturb):  # [m, d] -> [m, d]
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
        out = out + softmax(scores / math.sqrt(hd) + mask) @ cache["pv"][:, h]
    return out


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


def transformer_block(x, ln_1, attn, ln_2, mlp, n_head, eps, cache, perturb=None):  # [m, d] -> [m, d]
    x = x + mha(layer_norm(x, **ln_1, eps=eps), **attn, n_head=n_head, cache=cache, perturb=perturb)
    return x + feed_forward(layer_norm(x, **ln_2, eps=eps), **mlp, perturb=perturb)


def hidden(ids, start, wte, wpe, h, ln_f, n_head, eps, caches, trace=None, perturb=None):  # [m] -> [m, d], ln_f(x)
    x = wte["weight"][ids] + wpe["weight"][start : start + len(ids)]  # [m, d]
    xs = [x]
    for block, cache in zip(h, caches):
        x = transformer_block(x, **block, n_head=n_head, eps=eps, cache=cache, perturb=perturb)
        xs.append(x)
    if trace is not None:  # the residual stream: the embedding, then after each layer
        trace.append(xs)
    return layer_norm(x, **ln_f, eps=eps)


def gpt2(ids, start, wte, wpe, h, ln_f, n_head, eps, caches, trace=None, perturb=None):  # [m] -> [m, n_vocab]
    """perturb (optional) sees every multiply's output: .linear(x, weight, bias, y), .scores(q, k, q @ k.T)."""
    x = hidden(ids, start, wte, wpe, h, ln_f, n_head, eps, caches, trace, perturb)
    return linear(x, wte["weight"].T, 0, perturb)


class Reference:
    """numpy GPT-2 holding one text's KV cache; float32 or float64 throughout."""

    def __init__(self, model: Model, dtype=np.float32):
        self.hparams, self.dtype = model.hparams, np.dtype(dtype)
        self.params = _cast(model.params, self.dtype)
        self.trace: list | None = None  # set to []: each read appends [embedding, residual after layer 1..L]
        self.perturb = None  # see gpt2; vecgpt.tolerance moves each multiply's output by its error bound
        self.reset()

    def reset(self) -> None:
        d = self.hparams.n_embd
        self.caches = [
            {"k": np.zeros((0, d), self.dtype), "v": np.zeros((0, d), self.dtype)} for _ in range(self.hparams.n_layer)
        ]

    @property
    def position(self) -> int:
        return len(self.caches[0]["k"])

    def truncate(self, n: int) -> None:
        for cache in self.caches:
            cache.update({name: a[:n] for name, a in cache.items()})

    def hidden(self, ids) -> np.ndarray:  # [m] -> [m, d], the final vectors ln_f(x) of the m new positions
        ids = np.asarray(ids, dtype=np.int64)
        return hidden(
            ids,
            self.position,
            **self.params,
            n_head=self.hparams.n_head,
            eps=self.hparams.eps,
            caches=self.caches,
            trace=self.trace,
            perturb=self.perturb,
        )

    def logits(self, ids) -> np.ndarray:  # [m] -> [m, n_vocab] for the m new positions
        return linear(self.hidden(ids), self.params["wte"]["weight"].T, 0, self.perturb)

    def read(self, ids, k: int = 40) -> Candidates:
        """Feed tokens; the best k next tokens after the last one."""
        return top_k(self.logits(ids)[-1], k)


def _cast(params, dtype):
    if isinstance(params, dict):
        return {k: _cast(v, dtype) for k, v in params.items()}
    if isinstance(params, list):
        return [_cast(v, dtype) for v in params]
    return params.astype(dtype)
