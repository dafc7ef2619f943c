"""What output-layer indexes are measured on (held-out text, greedy decodes, exact baselines) and how:
recall, top-1 agreement, identical greedy steps, perplexities, latencies. Used by output_layer.py."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

# ---------------------------------------------------------------- data shared by every setting


def frequent_tokens(cfg, n_vocab) -> np.ndarray:
    from vecgpt import tokenizer

    if cfg["frequent"] <= 0:
        return np.array([tokenizer.ENDOFTEXT])[: int(tokenizer.ENDOFTEXT < n_vocab)]
    text = Path(cfg["corpus"]).read_text()
    ids = np.asarray(tokenizer.encode(text[: int(0.9 * len(text))]))
    ids = ids[ids < n_vocab]
    counts = np.bincount(ids, minlength=n_vocab)
    top = np.argsort(-counts, kind="stable")[: cfg["frequent"]]
    special = [tokenizer.ENDOFTEXT] if tokenizer.ENDOFTEXT < n_vocab else []
    return np.unique(np.concatenate([top, special]).astype(np.int64))


def exact_top(H, W, k=40, targets=None):
    """Exact float64 top-k ids per row of H, and (if targets) logsumexp and the target logits."""
    W64 = W.astype(np.float64)
    tops, lse, tl = [], [], []
    for s in range(0, len(H), 64):
        L = H[s : s + 64].astype(np.float64) @ W64.T  # [c, V]
        part = np.argpartition(-L, k - 1, axis=1)[:, :k]
        for row, p in zip(L, part):
            tops.append(p[np.lexsort((p, -row[p]))])
        if targets is not None:
            mx = L.max(1)
            lse.append(mx + np.log(np.exp(L - mx[:, None]).sum(1)))
            t = targets[s : s + 64]
            tl.append(np.where(t < len(W), L[np.arange(len(L)), np.minimum(t, len(W) - 1)], np.nan))
    out = np.array(tops)
    return (out, np.concatenate(lse), np.concatenate(tl)) if targets is not None else out


def prepare(model, cfg) -> dict:
    """Everything the index settings of one model are measured on and against (exact tops, baselines)."""
    from vecgpt.reference import Reference
    from vecgpt.sampling import top_k

    W = np.ascontiguousarray(model.params["wte"]["weight"][: cfg["vocab"] or None], np.float32)
    ref = Reference(model, np.float32)
    H, targets = held_out(ref, cfg, model.hparams.n_ctx)
    top40, lse, tlogit = exact_top(H, W, 40, targets)
    G, g_top, per_prompt, body = greedy_decodes(ref, W, cfg, model.hparams.n_ctx)
    # exact baselines at batch 1: numpy product + top-40, and the whole token with the exact head
    lat_H = H[: cfg["latency_queries"]]
    numpy_ms, numpy_p10 = latency_ms(lambda h: top_k(W @ h, 40), lat_H)
    whole_exact = whole_token_ms(lambda: ExactReader(ref, W), lambda r, tok: r.read([tok]), cfg, model)
    return {
        "W": W,
        "H": H,
        "targets": targets,
        "top40": top40,
        "lse": lse,
        "tlogit": tlogit,
        "G": G,
        "g_top": g_top,
        "per_prompt": per_prompt,
        "lat_H": lat_H,
        "numpy_ms": numpy_ms,
        "numpy_p10_ms": numpy_p10,
        "body_ms": 1e3 * float(np.median(body)),
        "whole_exact_ms": whole_exact,
        "frequent": frequent_tokens(cfg, len(W)),
    }


def held_out(ref, cfg, n_ctx) -> tuple[np.ndarray, np.ndarray]:
    """Final vectors [positions, d] of the held-out windows, and the next token at each position."""
    from vecgpt import tokenizer

    from output_index import final_hidden

    text = Path(cfg["corpus"]).read_text()
    held = tokenizer.encode(text[int(0.9 * len(text)) :])
    win = min(cfg["window"], n_ctx)
    starts = np.linspace(0, len(held) - win - 1, cfg["windows"]).astype(int)
    H, targets = [], []
    for s in starts:
        ref.reset()
        toks = held[s : s + win]
        H.append(final_hidden(ref, toks[:-1]))
        targets += toks[1:]
    return np.vstack(H).astype(np.float32), np.asarray(targets)


def greedy_decodes(ref, W, cfg, n_ctx):
    """Exact greedy decodes of the prompts: the final vector at every step [n, d], the exact argmax at
    each, the steps per prompt, and the seconds of each step's body (everything but the output layer)."""
    from vecgpt import tokenizer

    from output_index import final_hidden

    W64 = W.astype(np.float64)
    G, per_prompt, body = [], [], []
    for prompt in cfg["prompts"]:
        ids = tokenizer.encode(prompt)
        steps = min(cfg["steps"], n_ctx - len(ids))
        ref.reset()
        h = final_hidden(ref, ids)[-1]
        for _ in range(steps):
            G.append(h.astype(np.float32))
            tok = int(np.argmax(W64 @ h.astype(np.float64)))
            t = time.perf_counter()
            h = final_hidden(ref, [tok])[-1]
            body.append(time.perf_counter() - t)
        per_prompt.append(steps)
    G = np.asarray(G, np.float32)
    g_top = np.argmax(G.astype(np.float64) @ W64.T, axis=1) if len(G) else np.zeros(0, np.int64)
    return G, g_top, per_prompt, body


class ExactReader:
    """The reference body with the exact output layer over W (float32 product + top-40, as Reference.read)."""

    def __init__(self, ref, W):
        self.ref, self.W = ref, W

    def read(self, ids, k: int = 40):
        from vecgpt.sampling import top_k

        from output_index import final_hidden

        return top_k(self.W @ final_hidden(self.ref, ids)[-1], k)


def median_ms(fn, queries) -> float:
    return latency_ms(fn, queries)[0]


def latency_ms(fn, queries) -> tuple[float, float]:
    """Median and 10th-percentile wall time of fn(h) over the queries, one at a time, in ms.

    On a shared machine the median carries other processes' load; the 10th percentile is closer to
    the uncontended cost. Both are reported.
    """
    fn(queries[0])  # warm
    times = []
    for h in queries:
        t = time.perf_counter()
        fn(h)
        times.append(time.perf_counter() - t)
    return 1e3 * float(np.median(times)), 1e3 * float(np.percentile(times, 10))


def whole_token_ms(make_reader, step, cfg, model) -> float:
    """Median time of one greedy decode step (body + output layer) after the first prompt."""
    from vecgpt import tokenizer

    reader = make_reader()
    reader.ref.reset()
    cands = reader.read(tokenizer.encode(cfg["prompts"][0]), 40)
    n = min(cfg["whole_steps"], model.hparams.n_ctx - len(tokenizer.encode(cfg["prompts"][0])) - 1)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        cands = step(reader, int(cands.ids[0]))
        times.append(time.perf_counter() - t)
    return 1e3 * float(np.median(times)) if times else float("nan")


# ---------------------------------------------------------------- one index setting


def evaluate(index, data, cfg, model) -> dict:
    from vecgpt.reference import Reference

    from output_index import AnnReader, Head

    W, k = data["W"], cfg["k"]
    head = Head(index, W, k, data["frequent"])
    V = len(W)

    raw, text_c = head.candidates_many(data["H"])
    top40 = data["top40"]
    rec = {
        n: float(np.mean([len(set(c.ids[:n]) & set(t[:n])) / n for c, t in zip(text_c, top40)])) for n in (1, 10, 40)
    }
    raw_rec10 = float(np.mean([len(set(r[:10]) & set(t[:10])) / 10 for r, t in zip(raw, top40)]))
    ppl = perplexities(text_c, data, V)
    _, g_c = head.candidates_many(data["G"])
    agree = np.array([c.ids[0] == t for c, t in zip(g_c, data["g_top"])])
    identical = identical_steps(agree, data["per_prompt"])
    # latency at batch 1
    head_ms, head_p10 = latency_ms(head.candidates, data["lat_H"])
    try:
        store_exact_ms = median_ms(lambda h: index.exact_search(h, 40), data["lat_H"][:20])
    except NotImplementedError:
        store_exact_ms = float("nan")
    whole = whole_token_ms(
        lambda: AnnReader(Reference(model, np.float32), head), lambda r, tok: r.read([tok]), cfg, model
    )
    mem = index.memory_bytes()
    return {
        "candidates_mean": float(np.mean([len(c.ids) for c in text_c])),
        "recall@1": rec[1],
        "recall@10": rec[10],
        "recall@40": rec[40],
        "index_recall@10": raw_rec10,
        "top1_agreement": float(agree.mean()),
        "greedy_positions": int(len(agree)),
        "identical_steps": identical,
        "all_identical": float(np.mean([i == n for i, n in zip(identical, data["per_prompt"])])),
        **ppl,
        "head_ms": head_ms,
        "numpy_ms": data["numpy_ms"],
        "store_exact_ms": store_exact_ms,
        "speedup": data["numpy_ms"] / head_ms,
        "speedup_vs_store_exact": store_exact_ms / head_ms,
        "head_p10_ms": head_p10,
        "numpy_p10_ms": data["numpy_p10_ms"],
        "speedup_p10": data["numpy_p10_ms"] / head_p10,
        "token_ms": whole,
        "token_exact_ms": data["whole_exact_ms"],
        "token_speedup": data["whole_exact_ms"] / whole,
        "build_s": index.build_seconds,
        "index_MB": None if mem is None else mem / 1e6,
        "token_matrix_MB": W.nbytes / 1e6,
        "exact_scores": index.exact_scores,
        "store_exact": index.exact_label,
    }


def perplexities(text_c, data, V) -> dict:
    """Held-out perplexity: full softmax, candidates only, and the floor rule for the missing mass.

    Only positions whose target is in the output vocabulary count. Floor rule: every token outside the
    candidates gets the lowest candidate logit, Z = sum_cand e^l + (V - n) e^l_min.
    """
    nll_full, nll_c, nll_floor, miss = [], [], [], []
    for (ids, logits), t, lse, tl in zip(text_c, data["targets"], data["lse"], data["tlogit"]):
        if t >= V:
            continue
        nll_full.append(lse - tl)
        mx = logits.max()
        z_c = mx + math.log(np.exp(logits - mx).sum())
        lo = logits.min()
        z_f = np.logaddexp(z_c, lo + math.log(max(V - len(ids), 1)))
        hit = np.flatnonzero(ids == t)
        miss.append(len(hit) == 0)
        nll_c.append(z_c - logits[hit[0]] if len(hit) else math.inf)
        nll_floor.append(z_f - (logits[hit[0]] if len(hit) else lo))
    nll_c = np.asarray(nll_c)
    finite = np.isfinite(nll_c)
    return {
        "ppl_full": float(np.exp(np.mean(nll_full))),
        "ppl_candidates": float(np.exp(np.mean(nll_c))) if finite.all() else math.inf,
        "ppl_candidates_hits": float(np.exp(np.mean(nll_c[finite]))) if finite.any() else math.nan,
        "target_miss": float(np.mean(miss)),
        "ppl_floor": float(np.exp(np.mean(nll_floor))),
    }


def identical_steps(agree, per_prompt) -> list[int]:
    """Greedy steps identical to exact decoding, per prompt: the positions before the first top-1 disagreement."""
    out, pos = [], 0
    for n in per_prompt:
        a = agree[pos : pos + n]
        out.append(n if a.all() else int(np.argmin(a)))
        pos += n
    return out
