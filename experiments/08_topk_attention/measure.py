"""Top-K attention against full attention in numpy float64: greedy agreement, KL, attention mass, recall.

For each context length and passage, full attention reads the passage's windows once (its logits, and every head's
weights at the step's query); each K then reads them again keeping each query's own key and its K best earlier
ones (exact: by q.k; hnsw: the keys an HNSW index returns). A step agrees when both pick the same greedy token.
KL is KL(full || top-K) of the next-token distributions (softmax of the logits, temperature 1), in nats.
"""

from __future__ import annotations

import sys
import time

import numpy as np
from ann_keep import HnswTopK
from passages import windows
from sparse_forward import exact_top_k, forward, mass_held

ALL = "all"


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


def k_value(k, context: int) -> int:  # K as a number of earlier keys: all = every earlier key of the step's query
    return context - 1 if k == ALL else min(int(k), context - 1)


class Tally:
    """Steps, agreements and KL of one (context, K, search) cell, summed over passages."""

    def __init__(self):
        self.steps = self.agree = 0
        self.kls: list[np.ndarray] = []
        self.recall_found = self.recall_wanted = self.retries = 0
        self.seconds = 0.0

    def add(self, full_logits, logits) -> None:
        self.steps += len(logits)
        self.agree += int((logits.argmax(-1) == full_logits.argmax(-1)).sum())
        self.kls.append(kl(full_logits, logits))

    def row(self) -> dict:
        kls = np.concatenate(self.kls) if self.kls else np.zeros(0)
        out = {
            "steps": self.steps,
            "agreement": self.agree / self.steps if self.steps else None,
            "disagreements": self.steps - self.agree,
            "kl_mean": float(kls.mean()) if len(kls) else None,
            "kl_median": float(np.median(kls)) if len(kls) else None,
            "kl_max": float(kls.max()) if len(kls) else None,
            "seconds": self.seconds,
        }
        if self.recall_wanted:
            out.update(
                recall=self.recall_found / self.recall_wanted,
                searches_retried=self.retries,
            )
        return out


def run_context(model, passages, context, ks, steps, approx, hnsw, quiet=False) -> dict:
    """Every K on one context length (approx: the passages and the largest K the hnsw search runs on):
    {"exact": {K: Tally}, "hnsw": {K: Tally}, "exact_on_hnsw_passages": ...,
    "mass": [nK, L, H] mean over steps, "full_accuracy": share of steps where full attention's greedy token is the
    passage's next token}."""
    params, hp = model.params, model.hparams
    approx_passages, approx_max_k = approx
    exact, approx, exact_sub = ({k: Tally() for k in ks} for _ in range(3))
    mass_sum, hits, n = 0.0, 0, 0
    for p, passage in enumerate(passages):
        ids, targets = windows(passage, context, steps)
        record = {}
        full = forward(params, hp, ids, None, record)
        mass_sum = mass_sum + mass_held(record["probs"], [None if k == ALL else k for k in ks]).sum(axis=2)
        hits, n = hits + int((full.argmax(-1) == targets).sum()), n + len(ids)
        for k in ks:
            t = time.perf_counter()
            logits = forward(params, hp, ids, exact_top_k(k_value(k, context)))
            exact[k].seconds += time.perf_counter() - t
            exact[k].add(full, logits)
            if p < approx_passages and k != ALL and int(k) < context - 1 and int(k) <= approx_max_k:
                exact_sub[k].add(full, logits)
                run_hnsw(approx[k], params, hp, ids, full, int(k), hnsw)
        if not quiet:
            print(f"  context {context}: passage {p + 1}/{len(passages)}", file=sys.stderr)
    return {
        "exact": exact,
        "hnsw": {k: t for k, t in approx.items() if t.steps},
        "exact_on_hnsw_passages": {k: t for k, t in exact_sub.items() if t.steps},
        "mass": mass_sum / n,
        "full_accuracy": hits / n,
    }


def run_hnsw(tally, params, hp, ids, full, k, hnsw) -> None:
    sel = HnswTopK(k, **hnsw)
    t = time.perf_counter()
    logits = forward(params, hp, ids, sel)
    tally.seconds += time.perf_counter() - t
    tally.add(full, logits)
    tally.recall_found += sel.found
    tally.recall_wanted += sel.wanted
    tally.retries += sel.retries


def per_token(hp, context: int, k) -> dict:
    """What a step at this context asks of the key search, by formula: per layer and head, every earlier key scored
    (an exact search), min(K, context - 1) of them returned, their values and the query's own read."""
    heads = hp.n_layer * hp.n_head
    kept = k_value(k, context)
    return {"keys_scored": heads * (context - 1), "keys_returned": heads * kept, "values_read": heads * (kept + 1)}


def smallest_k(rows, context, target=0.99, search="exact"):
    """The smallest K of the sweep whose greedy agreement reaches target at this context (ALL where only all does)."""
    for r in rows:
        if r["context"] == context and r["search"] == search and r["agreement"] >= target:
            return r["k"]
    return None


def bisect_k(model, passages, context, lo, hi, steps, probes, target=0.99):
    """Between a K below target (lo) and one reaching it (hi), up to `probes` more Ks by bisection on the same
    steps -> (probe rows, lo, hi): hi reaches target and lo does not, so the smallest such K lies in (lo, hi]
    where agreement grows with K between them (it need not: the probes are reported as measured)."""
    params, hp = model.params, model.hparams
    steps_ids = [windows(p, context, steps)[0] for p in passages]
    full = [forward(params, hp, ids) for ids in steps_ids]
    rows = []
    for _ in range(probes):
        if hi - lo <= 1:
            break
        mid, tally = (lo + hi) // 2, Tally()
        t = time.perf_counter()
        for ids, f in zip(steps_ids, full):
            tally.add(f, forward(params, hp, ids, exact_top_k(mid)))
        tally.seconds = time.perf_counter() - t
        rows.append({"context": context, "k": mid, **tally.row()})
        lo, hi = (lo, mid) if rows[-1]["agreement"] >= target else (mid, hi)
    return rows, lo, hi


def bisect_bounds(rows, context, target=0.99):
    """(lo, hi) around the sweep's smallest K reaching target (as numbers of earlier keys), or None."""
    sweep = [r for r in rows if r["context"] == context and r["search"] == "exact"]
    for prev, r in zip(sweep, sweep[1:]):
        if r["agreement"] >= target and prev["agreement"] < target:
            return k_value(prev["k"], context), k_value(r["k"], context)
    return None
