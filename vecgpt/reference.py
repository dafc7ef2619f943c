"""The ordinary numpy GPT-2 forward pass with a KV cache: the yardstick for every store."""

from __future__ import annotations

import math

import numpy as np

from vecgpt.policy import Policy, as_policy
from vecgpt.sampling import Candidates, top_k
from vecgpt.weights import Model


def gelu(x):  # GPT-2's tanh form ("gelu_new"); x * x * x, as x**3 calls pow() per element (far slower)
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * (x * x * x))))


def softmax(x):  # [..., n] -> [..., n], over the last axis
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def layer_norm(x, weight, bias, eps):  # [m, d] -> [m, d]
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return weight * (x - mean) / np.sqrt(var + eps) + bias


def linear(x, weight, bias):  # [m, in], [in, out], [out] -> [m, out]
    return x @ weight + bias


def feed_forward(x, c_fc, c_proj):  # [m, d] -> [m, d]; GPT-2's "mlp"
    return linear(gelu(linear(x, **c_fc)), **c_proj)


def attention(q, k, v, mask, policy=None):  # [m, hd], [n, hd], [n, hd], [m, n] -> [m, hd]
    scores = q @ k.T / math.sqrt(q.shape[-1]) + mask
    return softmax(scores if policy is None or not policy.active else keep(scores, policy)) @ v


def keep(scores, policy):  # [m, n] -> [m, n]: each query's own key and the earlier ones its policy keeps; else -inf
    m, n = scores.shape
    kept = np.zeros((m, n), bool)
    for row in range(m):
        i = n - m + row  # the query's position: its earlier keys are 0..i-1
        kept[row, :i], kept[row, i] = policy.kept(scores[row, :i]), True
    return np.where(kept, scores, -np.inf)


def keep_top_k(scores, k):  # [m, n] -> [m, n]: each query's own key and its k best earlier ones; the rest -inf
    return keep(scores, Policy(top_k=k))


def causal_mask(m, n, dtype):  # query i of the last m sits at position n - m + i
    return np.triu(np.full((m, n), -np.inf, dtype), k=n - m + 1)


def mha(x, c_attn, c_proj, n_head, cache, policy=None):  # [m, d] -> [m, d]; cache holds "k", "v" [n, d]
    q, k, v = np.split(linear(x, **c_attn), 3, axis=-1)  # [m, d] each
    cache["k"], cache["v"] = np.concatenate([cache["k"], k]), np.concatenate([cache["v"], v])  # [n, d]
    mask = causal_mask(len(x), len(cache["k"]), x.dtype)  # [m, n]
    heads = [
        attention(qh, kh, vh, mask, policy)
        for qh, kh, vh in zip(*(np.split(a, n_head, axis=-1) for a in (q, cache["k"], cache["v"])))
    ]  # n_head x [m, hd]
    return linear(np.hstack(heads), **c_proj)  # [m, d]


def transformer_block(x, ln_1, attn, ln_2, mlp, n_head, eps, cache, policy=None):  # [m, d] -> [m, d]
    x = x + mha(layer_norm(x, **ln_1, eps=eps), **attn, n_head=n_head, cache=cache, policy=policy)
    return x + feed_forward(layer_norm(x, **ln_2, eps=eps), **mlp)


def hidden(ids, start, wte, wpe, h, ln_f, n_head, eps, caches, trace=None, policy=None):  # [m] -> [m, d], ln_f(x)
    x = wte["weight"][ids] + wpe["weight"][start : start + len(ids)]  # [m, d]
    xs = [x]
    for block, cache in zip(h, caches):
        x = transformer_block(x, **block, n_head=n_head, eps=eps, cache=cache, policy=policy)
        xs.append(x)
    if trace is not None:  # the residual stream: the embedding, then after each layer
        trace.append(xs)
    return layer_norm(x, **ln_f, eps=eps)


def gpt2(ids, start, wte, wpe, h, ln_f, n_head, eps, caches, trace=None, policy=None):  # [m] -> [m, n_vocab]
    return linear(hidden(ids, start, wte, wpe, h, ln_f, n_head, eps, caches, trace, policy), wte["weight"].T, 0)


class Reference:
    """numpy GPT-2 holding one text's KV cache; float32 or float64 throughout. `policy` (vecgpt.policy): the earlier
    keys each query attends to beside its own (None: every one); `attention_top_k` K: Policy(top_k=K)."""

    def __init__(self, model: Model, dtype=np.float32, attention_top_k: int | None = None, policy=None):
        self.hparams, self.dtype = model.hparams, np.dtype(dtype)
        self.policy = policy or as_policy(attention_top_k)
        self.params = _cast(model.params, self.dtype)
        self.trace: list | None = None  # set to []: each read appends [embedding, residual after layer 1..L]
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
            policy=self.policy,
        )

    def logits(self, ids) -> np.ndarray:  # [m] -> [m, n_vocab] for the m new positions
        return linear(self.hidden(ids), self.params["wte"]["weight"].T, 0)

    def read(self, ids, k: int = 40) -> Candidates:
        """Feed tokens; the best k next tokens after the last one."""
        return top_k(self.logits(ids)[-1], k)


def _cast(params, dtype):
    if isinstance(params, dict):
        return {k: _cast(v, dtype) for k, v in params.items()}
    if isinstance(params, list):
        return [_cast(v, dtype) for v in params]
    return params.astype(dtype, copy=False)  # a model already in that dtype is not held twice
