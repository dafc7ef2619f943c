"""Attention policies against full attention in numpy float64: greedy agreement, KL, mass held, keys read.

Each window of a passage goes through the model (GPT-2: sparse_forward; a Llama: sparse_llama) once with full attention and once a policy (vecgpt.policy: top-k, a
threshold, sinks and a window alone or with top-k), every query of every layer keeping what reference.keep keeps.
A step is one query: the queries at positions C - span .. C - 1 of every window are context C's steps (attention is
causal: each reads what a text of its position + 1 tokens reads). A step agrees when both pick the same greedy
token. KL(full || policy) of the next-token distributions (temperature 1, nats) is taken at position C - 1 alone.
Mass held: under full attention, the share of each head's weight on the keys the policy keeps of full attention's
scores. Keys returned, values read and keys scored a token are counted from the policy's kept sets (the engine's
decode step: its searches return exactly those keys), per query head: under grouped-query attention a key head's
keys serve its group's query heads, each keeping its own set, and `keys_returned_union` counts what a group keeps
together (the distinct keys a key head gives up).
"""

from __future__ import annotations

import time

import numpy as np
import sparse_forward
import sparse_llama
from sparse_forward import kept_mask, policy_keep, spans

from vecgpt.policy import Policy, dropped_bound

ALL = "all"
ROWS = 512  # logits computed this many rows at a time (float64: 200 MB)


def log_softmax(logits):  # [B, V] -> [B, V]
    z = logits - logits.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def kl(full_logits, logits):  # per row, KL(full || other) in nats
    p = log_softmax(full_logits)
    return (np.exp(p) * (p - log_softmax(logits))).sum(axis=-1)


def k_arg(text: str):
    """A K as given on the command line: a whole number of keys, 1 or more, or `all`."""
    from vecgpt.errors import VecgptError

    if text == ALL:
        return ALL
    if not text.isdigit() or int(text) < 1:
        raise VecgptError(f"K must be a whole number of keys, 1 or more, or 'all'; not {text!r}")
    return int(text)


class Steps:
    """The windows [N, longest] and the query positions read: context C's steps are positions C - span .. C - 1."""

    def __init__(self, windows, contexts, span):
        self.windows, self.contexts, self.span = np.asarray(windows), sorted(contexts), span
        self.positions = np.unique(np.concatenate([np.arange(c - span, c) for c in self.contexts]))

    def at(self, context):  # indices into positions of context C's steps
        return np.searchsorted(self.positions, np.arange(context - self.span, context))


def forward_of(model):
    """The model's batched forward (hidden_at of sparse_forward or sparse_llama) and output matrix [n_vocab, d]."""
    from vecgpt.families import LlamaHParams

    params = model.params
    if isinstance(model.hparams, LlamaHParams):
        return sparse_llama.hidden_at, (params.get("lm_head") or params["model"]["embed_tokens"])["weight"]
    return sparse_forward.hidden_at, params["wte"]["weight"]


def greedy_and_kl(h, h_full, wte, kl_rows):
    """Final vectors [R, d] -> greedy tokens [R], and KL from full attention's (h_full) at kl_rows (else nan)."""
    tokens, kls = np.empty(len(h), np.int64), np.full(len(h), np.nan)
    for lo in range(0, len(h), ROWS):
        logits = h[lo : lo + ROWS] @ wte.T
        tokens[lo : lo + ROWS] = logits.argmax(-1)
        rows = np.flatnonzero(kl_rows[lo : lo + ROWS])
        if len(rows) and h_full is not None:
            kls[lo + rows] = kl(h_full[lo + rows] @ wte.T, logits[rows])
    return tokens, kls


def full_attention(model, steps, chunk=32) -> dict:
    """Full attention over every window once: greedy tokens [N, P], final vectors [N, P, d], and per layer the
    scaled scores and weights at the read positions [N, H, P, longest]."""
    (params, hp), (hidden_at, output), parts = (model.params, model.hparams), forward_of(model), []
    for lo in range(0, len(steps.windows), chunk):
        record = {}
        h = hidden_at(params, hp, steps.windows[lo : lo + chunk], steps.positions, None, record)
        tokens, _ = greedy_and_kl(h.reshape(-1, h.shape[-1]), None, output, np.zeros(h.size, bool))
        parts.append((h, tokens.reshape(h.shape[:2]), record["scores"], record["weights"]))
    layers = range(hp.n_layer)
    return {
        "hidden": np.concatenate([p[0] for p in parts]),
        "greedy": np.concatenate([p[1] for p in parts]),
        "scores": [np.concatenate([p[2][i] for p in parts]) for i in layers],
        "weights": [np.concatenate([p[3][i] for p in parts]) for i in layers],
    }


def evaluate(model, steps, full, policy, contexts=None, windows=None, keep=None, chunk=32) -> dict:
    """One policy's steps at `contexts` (default every one; windows cut to the longest) on `windows` (indices,
    default all) -> {context: row}. keep: the selector (default: the policy's exact one, reference.keep's set)."""
    hp, d = model.hparams, model.hparams.n_embd
    contexts = sorted(contexts or steps.contexts)
    widx = np.arange(len(steps.windows)) if windows is None else np.asarray(windows)
    pidx = np.unique(np.concatenate([steps.at(c) for c in contexts]))
    positions, n = steps.positions[pidx], max(contexts)
    t = time.perf_counter()
    parts = [
        run_chunk(model, steps.windows[widx[lo : lo + chunk], :n], positions, keep or policy_keep(policy), policy)
        for lo in range(0, len(widx), chunk)
    ]
    h, earlier, dropped, union = (np.concatenate([p[i] for p in parts]) for i in range(4))
    kl_rows = np.tile(np.isin(positions, [c - 1 for c in contexts]), len(widx))
    h_full = full["hidden"][widx][:, pidx].reshape(-1, d)
    tokens, kls = greedy_and_kl(h.reshape(-1, d), h_full, forward_of(model)[1], kl_rows)
    seconds = time.perf_counter() - t
    agree = tokens.reshape(len(widx), -1) == full["greedy"][widx][:, pidx]
    mass, over = held(full, widx, pidx, positions, policy, n)
    out = {}
    for c in contexts:
        at = np.searchsorted(positions, np.arange(c - steps.span, c))
        got = (agree[:, at], kls.reshape(len(widx), -1)[:, at[-1]], earlier[..., at], dropped[..., at], mass[..., at])
        out[c] = {**context_row(policy, positions[at], *got, hp), "dropped_weight_over_bound": over}
        out[c]["per_token"]["keys_returned_union"] = float(union[..., at].sum(axis=(1, 2)).mean())
        out[c]["seconds"] = seconds
    return out


def run_chunk(model, windows, positions, keep, policy):
    """A chunk of windows under a selector -> final vectors [b, P, d], earlier keys kept [b, L, H, P], keys between
    the sinks and the window left out [b, L, H, P], and earlier keys a key head's group keeps together [b, L, K, P]
    (K = H without grouped-query attention)."""
    record, hp = {}, model.hparams
    h = forward_of(model)[0](model.params, hp, windows, positions, keep, record)
    kept = np.stack(record["kept"], 1)  # [b, L, H, P, n]
    _, middle = spans(policy, positions, windows.shape[1])
    union = sparse_llama.union_kept(kept, getattr(hp, "n_kv_head", hp.n_head)) - 1
    return h, kept.sum(-1) - 1, (middle & ~kept).sum(-1), union


def held(full, widx, pidx, positions, policy, n):
    """Under full attention: the weight [N, L, H, P] on the keys the policy keeps of full attention's scores, and
    (a threshold) the most by which the weight its dropped keys hold exceeds their bound (<= 0: within it)."""
    mass, over = [], None
    for scores, weights in zip(full["scores"], full["weights"]):
        s, w = scores[widx][:, :, pidx, :n], weights[widx][:, :, pidx, :n]
        keep = kept_mask(s, positions, policy) if policy.active else np.isfinite(s)
        mass.append((w * keep).sum(-1))
        if policy.threshold is not None:
            dropped = (spans(policy, positions, n)[1] & ~keep).sum(-1)
            excess = float(((1 - mass[-1]) - dropped_bound(policy.threshold, dropped)).max())
            over = excess if over is None else max(over, excess)
    return np.stack(mass, 1), over


def context_row(policy, positions, agree, kls, earlier, dropped, mass, hp) -> dict:
    """One context's figures: agree [N, S], kls [N], earlier / dropped / mass [N, L, H, S] at positions [S]."""
    heads = hp.n_layer * hp.n_head
    kls = kls[np.isfinite(kls)]
    per_head = mass.mean(axis=(0, 3))  # [L, H]
    returned = float(earlier.sum(axis=(1, 2)).mean())
    row = {
        "steps": int(agree.size),
        "agreement": float(agree.mean()),
        "disagreements": int((~agree).sum()),
        "kl_steps": int(len(kls)),
        "kl_mean": float(kls.mean()) if len(kls) else None,
        "kl_max": float(kls.max()) if len(kls) else None,
        "mass_mean": float(per_head.mean()),
        "mass_min_head": float(per_head.min()),
        "kept_per_head": [round(float(k), 3) for k in earlier.mean(axis=(0, 3)).ravel()],
        "per_token": {
            "keys_returned": returned,
            "values_read": returned + heads,
            "keys_scored": heads * float(np.mean([scored(policy, int(i)) for i in positions])),
        },
    }
    if policy.threshold is not None:
        most = int(dropped.max())
        row.update(dropped_max=most, dropped_bound=float(dropped_bound(policy.threshold, np.asarray(most))))
    return row


def scored(policy: Policy, i: int) -> int:
    """q.k an exact store computes for one head's decode step at position i (vecgpt.text_keys): every earlier key,
    or the sinks, the window and what is between (twice under a threshold: its best, then its range)."""
    from vecgpt.text_keys import drops

    if not drops(policy, i):
        return i
    a, b = policy.middle(i)
    between = (b - a) * (1 if policy.top_k is not None else 2 if policy.threshold is not None else 0)
    return a + (i - b) + between
