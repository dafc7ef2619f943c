"""How far a store's logits may be from float64 numpy's on a Llama-family model, derived as vecgpt.tolerance derives
GPT-2's: reference_llama's forward in the engine's order (vecgpt.llama_rounds) in float64, each search's output moved
by its bound (tolerance.Perturbation: encoding.search_bound for q, k and v together, o_proj, gate and up together,
down and the output matrix, each with the M^2 of the documents as loaded; encoding.key_bound for the key scores,
against the rotated keys as stored), signs drawn at random, tol = SAFETY x the largest move over PATTERNS runs. The
order is the model's layout's: in five the raw values are kept in float32, each query head's softmax weighs its key
head's values, and o_proj is one search after attention; in four each position's value of key head kv is one search
of its query heads' slices of o_proj (h.<i>.attn.c_proj.<kv>, with that collection's M^2), each projected value kept
in float32 (Perturbation.project), and attention sums the query heads' weighted projected values. Rotation keeps
lengths, so a q or k moved by e before it is rotated is moved by e after; RMSNorm, SiLU and softmax are numpy's on
both sides. The rule that compares is tolerance.disagreements.
"""

from __future__ import annotations

import math

import numpy as np

from vecgpt import tolerance
from vecgpt.encoding import U32
from vecgpt.families import key_head
from vecgpt.loading import llama_layer
from vecgpt.orders import kept
from vecgpt.policy import as_policy
from vecgpt.reference_llama import LlamaReference, causal_mask, rms_norm, rotate_heads, silu, softmax


class LlamaInOrder:
    """reference_llama in float64 in a layout's order ("five" or "four"), the engine's searches moved by `perturb`
    (tolerance.Perturbation)."""

    def __init__(self, model64, perturb, layout: str = "five"):
        self.hp, self.perturb, self.layout = model64.hparams, perturb, layout
        plain = LlamaReference(model64, np.float64)
        self.freq, self.body = plain.freq, plain.body
        # the searches' matrices [in, out] as loaded, held for the run (Perturbation keeps M^2 by an array's address)
        self.layers = [llama_layer(block, i, self.hp, layout) for i, block in enumerate(self.body["layers"])]
        self.output = plain.output.T
        self.caches = [{"k": None, "v": None} for _ in range(self.hp.n_layer)]

    def linear(self, x, weight, bias):
        bias = 0.0 if bias is None else bias
        return self.perturb.linear(x, weight, bias, x @ weight + bias)

    def attention(self, x, layer, at):  # [m, d] -> [m, d], each head's scores moved by the key search's bound
        hp, mats, cache = self.hp, self.layers[layer], self.caches[layer]
        hd, n_kv = hp.head_dim, hp.n_kv_head
        q, k, v = np.split(
            self.linear(x, *mats[f"h.{layer}.attn.c_attn"]), [hp.n_head * hd, (hp.n_head + n_kv) * hd], 1
        )
        q, k = rotate_heads(q, hp.n_head, at, self.freq), rotate_heads(k, n_kv, at, self.freq)
        v = self.projected(v, layer) if self.layout == "four" else self.perturb.kept(v)
        cache["k"] = k if cache["k"] is None else np.concatenate([cache["k"], k])
        cache["v"] = v if cache["v"] is None else np.concatenate([cache["v"], v])
        mask = causal_mask(len(x), len(cache["k"]), x.dtype)
        ks, vs = np.split(cache["k"], n_kv, axis=1), np.split(cache["v"], n_kv, axis=1)
        heads = []
        for h, qh in enumerate(np.split(q, hp.n_head, axis=1)):
            kh = ks[key_head(h, hp.n_head, n_kv)]
            scores = self.perturb.scores(qh, kh, qh @ kh.T) / math.sqrt(hd) + mask
            weights = softmax(kept(scores, self.perturb))
            heads.append(weights @ (cache["v"][:, h] if self.layout == "four" else vs[key_head(h, hp.n_head, n_kv)]))
        if self.layout == "four":
            return sum(heads)
        return self.linear(np.hstack(heads), *mats[f"h.{layer}.attn.c_proj"])

    def projected(self, v, layer):  # [m, n_kv hd] -> [m, H, d]: each key head's value, one search of its query heads'
        hp, out = self.hp, []  # slices of o_proj, kept in float32
        for kv, vh in enumerate(np.split(v, hp.n_kv_head, axis=1)):
            weight, bias = self.layers[layer][f"h.{layer}.attn.c_proj.{kv}"]
            bias = 0.0 if bias is None else bias
            out.append(self.perturb.project(vh, weight, bias, vh @ weight + bias).reshape(len(v), hp.group, -1))
        return np.concatenate(out, axis=1)

    def logits(self, ids) -> np.ndarray:  # [m] -> [m, n_vocab]
        hp, start = self.hp, 0 if self.caches[0]["k"] is None else len(self.caches[0]["k"])
        at = np.arange(start, start + len(ids), dtype=np.float64)
        x = self.body["embed_tokens"]["weight"][np.asarray(ids, np.int64)]
        for layer, block in enumerate(self.body["layers"]):
            x = x + self.attention(rms_norm(x, block["input_layernorm"]["weight"], hp.eps), layer, at)
            gate, up = np.split(
                self.linear(
                    rms_norm(x, block["post_attention_layernorm"]["weight"], hp.eps),
                    *self.layers[layer][f"h.{layer}.mlp.c_fc"],
                ),
                2,
                axis=1,
            )
            x = x + self.linear(silu(gate) * up, *self.layers[layer][f"h.{layer}.mlp.c_proj"])
        return self.linear(rms_norm(x, self.body["norm"]["weight"], hp.eps), self.output, None)


def forced_logits(model64, prompt, tokens, policy=None, perturb=None, layout: str = "five") -> np.ndarray:
    """float64 numpy's logits [steps, vocab] at teacher_forced's steps (under an attention policy), or moved in the
    layout's order."""
    if perturb is None:
        key = ("llama forced", tolerance.ints(prompt), tolerance.ints(tokens), policy)
        return tolerance.remembered(
            model64, key, lambda: _forced(LlamaReference(model64, np.float64, policy), prompt, tokens)
        )
    return _forced(LlamaInOrder(model64, perturb, layout), prompt, tokens)


def _forced(ref, prompt, tokens) -> np.ndarray:
    return np.stack([ref.logits(prompt)[-1]] + [ref.logits([t])[-1] for t in tokens[:-1]])


def logit_tolerance(
    model64, prompt, tokens, metric, u, policy=None, padded_r2=None, stored=U32, layout: str = "five"
) -> np.ndarray:
    """Per step, the derived bound on |store logit - float64 numpy logit| in a layout (tolerance.logit_tolerance's
    rule)."""
    exact, moved = forced_logits(model64, prompt, tokens, policy), []
    for seed in range(tolerance.PATTERNS):
        perturb = tolerance.Perturbation(metric, u, seed, seed % 2 == 0, stored, layout, policy, padded_r2)
        moved.append(np.abs(forced_logits(model64, prompt, tokens, perturb=perturb, layout=layout) - exact).max(1))
    return tolerance.SAFETY * np.max(moved, axis=0)


def forced_comparison(reader, model64, prompt, tokens, metric, u, k: int = 40) -> dict:
    """A store's text and float64 numpy fed the same tokens, under the text's policy, the bound derived in the text's
    layout: the rule at every step."""
    cands = tolerance.teacher_forced(reader, prompt, tokens, k)
    policy = as_policy(reader.policy)
    policy = policy if policy.active else None
    bound = reader.engine.key_bound
    padded_r2 = None if bound is None else float(max(bound)) ** 2
    exact = forced_logits(model64, prompt, tokens, policy)
    tol = logit_tolerance(model64, prompt, tokens, metric, u, policy, padded_r2, layout=reader.layout)
    broken = [
        f"step {i}: {d}"
        for i, (c, row, t) in enumerate(zip(cands, exact, tol))
        for d in tolerance.disagreements(c, row, k, t)
    ]
    errors = np.array([tolerance.max_error(c, row) for c, row in zip(cands, exact)])
    return {"candidates": cands, "exact": exact, "tol": tol, "violations": broken, "max_error": errors}
