"""The ordinary numpy Llama forward pass with a KV cache: RMSNorm, rotary positions, SwiGLU, grouped-query
attention. The Llama family's yardstick, as reference.py is GPT-2's; Qwen2 adds biases to q, k and v, which
`linear` takes where the checkpoint has them. Weights are Hugging Face's, nn.Linear's [out, in]."""

from __future__ import annotations

import math

import numpy as np

from vecgpt.families import LlamaHParams, key_head
from vecgpt.policy import as_policy
from vecgpt.reference import keep
from vecgpt.sampling import Candidates, top_k


def silu(x):  # x * sigmoid(x), the sigmoid as tanh so a large negative x does not overflow exp
    return x * 0.5 * (1 + np.tanh(x / 2))


def softmax(x):  # [..., n] -> [..., n], over the last axis
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def rms_norm(x, weight, eps):  # [m, d] -> [m, d]
    return weight * (x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps))


def linear(x, weight, bias=None):  # [m, in], [out, in], [out] -> [m, out]
    return x @ weight.T if bias is None else x @ weight.T + bias


def inv_freq(head_dim, theta, scaling):  # [hd / 2]: the angle per position of each rotated pair
    freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    kind = scaling.get("rope_type", "default")
    if kind == "linear":
        return freq / scaling["factor"]
    if kind == "llama3":
        return llama3_inv_freq(freq, **{k: v for k, v in scaling.items() if k != "rope_type"})
    return freq


def llama3_inv_freq(freq, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings):
    """Llama 3's scaling: long wavelengths slowed by `factor`, short ones kept, those between blended."""
    wavelen = 2 * math.pi / freq
    low, high = original_max_position_embeddings / low_freq_factor, original_max_position_embeddings / high_freq_factor
    smooth = (original_max_position_embeddings / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * freq / factor + smooth * freq
    return np.where(wavelen > low, freq / factor, np.where(wavelen < high, freq, blended))


def rotary(x, positions, freq):  # [m, hd] -> [m, hd]: pair (i, i + hd/2) turned by position * freq[i]
    angle = positions[:, None] * freq[None, :]  # [m, hd / 2]
    cos, sin = np.cos(angle).astype(x.dtype), np.sin(angle).astype(x.dtype)
    x1, x2 = np.split(x, 2, axis=-1)
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def rotate_heads(x, n, positions, freq):  # [m, n * hd] -> [m, n * hd], each head rotated alone
    return np.hstack([rotary(head, positions, freq) for head in np.split(x, n, axis=-1)])


def causal_mask(m, n, dtype):  # query i of the last m sits at position n - m + i
    return np.triu(np.full((m, n), -np.inf, dtype), k=n - m + 1)


def attention(q, k, v, mask, policy=None):  # [m, hd], [n, hd], [n, hd], [m, n] -> [m, hd]
    scores = q @ k.T / math.sqrt(q.shape[-1]) + mask
    return softmax(scores if policy is None or not policy.active else keep(scores, policy)) @ v


def gqa(
    x, q_proj, k_proj, v_proj, o_proj, hp, freq, cache, policy=None
):  # [m, d] -> [m, d]; cache "k", "v" [n, n_kv * hd]
    positions = np.arange(len(cache["k"]), len(cache["k"]) + len(x), dtype=np.float64)
    q = rotate_heads(linear(x, **q_proj), hp.n_head, positions, freq)  # [m, n_head * hd]
    k = rotate_heads(linear(x, **k_proj), hp.n_kv_head, positions, freq)  # [m, n_kv * hd]
    cache["k"], cache["v"] = np.concatenate([cache["k"], k]), np.concatenate([cache["v"], linear(x, **v_proj)])
    mask = causal_mask(len(x), len(cache["k"]), x.dtype)  # [m, n]
    ks, vs = np.split(cache["k"], hp.n_kv_head, axis=-1), np.split(cache["v"], hp.n_kv_head, axis=-1)
    heads = [
        attention(qh, ks[key_head(h, hp.n_head, hp.n_kv_head)], vs[key_head(h, hp.n_head, hp.n_kv_head)], mask, policy)
        for h, qh in enumerate(np.split(q, hp.n_head, axis=-1))
    ]  # n_head x [m, hd]
    return linear(np.hstack(heads), **o_proj)  # [m, d]


def swiglu(x, gate_proj, up_proj, down_proj):  # [m, d] -> [m, d]; Llama's "mlp"
    return linear(silu(linear(x, **gate_proj)) * linear(x, **up_proj), **down_proj)


def transformer_block(x, input_layernorm, self_attn, post_attention_layernorm, mlp, hp, freq, cache, policy=None):
    x = x + gqa(rms_norm(x, **input_layernorm, eps=hp.eps), **self_attn, hp=hp, freq=freq, cache=cache, policy=policy)
    return x + swiglu(rms_norm(x, **post_attention_layernorm, eps=hp.eps), **mlp)


def hidden(ids, embed_tokens, layers, norm, hp, freq, caches, trace=None, policy=None):  # [m] -> [m, d], norm(x)
    x = embed_tokens["weight"][ids]  # [m, d]; positions enter in attention, by rotation
    xs = [x]
    for block, cache in zip(layers, caches):
        x = transformer_block(x, **block, hp=hp, freq=freq, cache=cache, policy=policy)
        xs.append(x)
    if trace is not None:
        trace.append(xs)
    return rms_norm(x, **norm, eps=hp.eps)


class LlamaReference:
    """numpy Llama holding one text's KV cache; float32 or float64 throughout (the rotary angles in float64).
    `policy` (vecgpt.policy, as reference.Reference's): the earlier keys each query attends to beside its own."""

    def __init__(self, model, dtype=np.float32, policy=None):
        self.hparams: LlamaHParams = model.hparams
        self.dtype, self.policy = np.dtype(dtype), as_policy(policy)
        params = _cast(model.params, self.dtype)
        self.body = params["model"]  # embed_tokens, layers, norm
        self.output = (params.get("lm_head") or self.body["embed_tokens"])["weight"]  # [vocab, d]
        self.freq = inv_freq(self.hparams.head_dim, self.hparams.rope_theta, self.hparams.scaling)
        self.trace: list | None = None  # set to []: each read appends [embedding, residual after layer 1..L]
        self.reset()

    def reset(self) -> None:
        width = self.hparams.n_kv_head * self.hparams.head_dim
        empty = np.zeros((0, width), self.dtype)
        self.caches = [{"k": empty, "v": empty} for _ in range(self.hparams.n_layer)]

    @property
    def position(self) -> int:
        return len(self.caches[0]["k"])

    def truncate(self, n: int) -> None:
        for cache in self.caches:
            cache.update({name: a[:n] for name, a in cache.items()})

    def hidden(self, ids) -> np.ndarray:  # [m] -> [m, d], the final vectors norm(x) of the m new positions
        ids = np.asarray(ids, dtype=np.int64)
        body, hp = self.body, self.hparams
        return hidden(ids, **body, hp=hp, freq=self.freq, caches=self.caches, trace=self.trace, policy=self.policy)

    def logits(self, ids) -> np.ndarray:  # [m] -> [m, n_vocab] for the m new positions
        return linear(self.hidden(ids), self.output)

    def read(self, ids, k: int = 40) -> Candidates:
        """Feed tokens; the best k next tokens after the last one."""
        return top_k(self.logits(ids)[-1], k)


def generate(reference: LlamaReference, ids: list[int], n: int, eos: int | None = None) -> list[int]:
    """Greedy: the n tokens after `ids` (fewer if `eos` comes), ties to the lowest id."""
    out, logits = [], reference.logits(ids)[-1]
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        if out[-1] == eos or len(out) == n:
            break
        logits = reference.logits(out[-1:])[-1]
    return out


def _cast(params, dtype):
    if isinstance(params, dict):
        return {k: _cast(v, dtype) for k, v in params.items()}
    if isinstance(params, list):
        return [_cast(v, dtype) for v in params]
    return params.astype(dtype, copy=False)
