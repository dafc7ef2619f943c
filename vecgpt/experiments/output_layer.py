"""Output layer as an ANN search (issue 7): what an index over the token vectors buys and costs.

For each model and each index setting of a grid (experiments/05_output_layer/grid.toml):
recall@1/@10/@40 against the exact top-40, top-1 agreement over greedy decodes, greedy steps
identical to exact decoding, perplexity with the softmax over the candidates only versus the full
softmax, output-layer latency against the exact numpy product and the same store's exact search,
whole-token latency, build time and index memory. Writes results.json, results.md and
output_layer.png to results/05_output_layer/ (or --out).

The hidden states come from the numpy reference (float32), the exact logits from float64 products
of those float32 vectors. Greedy identity needs no second decode: an index decode is the exact
decode until the first position where its top-1 differs, so the identical prefix is the number of
steps before the first disagreement along the exact trajectory.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

import numpy as np

NAME = "output-layer"
HELP = "the output layer as an ANN search (hnswlib, FAISS, LanceDB, pgvector): recall, agreement, speed"
DEFAULT_GRID = Path(__file__).resolve().parents[2] / "experiments" / "05_output_layer" / "grid.toml"
CORPUS = Path("/work/shared/data/tinyshakespeare.txt")
RANDOM_DIR = "gpt2-small-random-s0"

DEFAULTS = {
    "models": ["random"],  # "random" (GPT-2 small shape, random weights), "shipped", "gpt2", or a folder
    "k": 50,  # candidates asked of the index (the paper's 50)
    "frequent": 64,  # most frequent training tokens always scored exactly (plus <|endoftext|>)
    "vocab": 0,  # >0: only the first `vocab` token vectors form the output layer (tiny test grids)
    "corpus": str(CORPUS),  # first 90% counts frequent tokens, last 10% is held out
    "windows": 4, "window": 64,  # held-out windows for recall and perplexity (positions = windows * (window-1))
    "prompts": ["ROMEO:", "First Citizen:\nBefore we proceed any further,", "The king is dead", "To be, or not"],
    "steps": 32,  # greedy steps per prompt
    "latency_queries": 100,  # positions timed one at a time for output-layer latency
    "whole_steps": 16,  # decode steps timed for whole-token latency
    "threads": 2,  # index builds; searches run on one thread (batch 1)
    "seed": 0,
}

PUBLISHED = [
    {"source": "Loretz et al. 2026", "model": "Gemma-3-270M", "setting": "hnswlib M=32 efc=5000 ef=200, k=50",
     "output_layer_speedup": "23.9x (38.3 -> 1.6 ms)", "top1_agreement": "99.2-99.6% (range over models)",
     "token_speedup": "1.82x"},
    {"source": "Loretz et al. 2026", "model": "Gemma / Llama / Qwen (range)", "setting": "ef=100 / 200 / 400",
     "output_layer_speedup": "13x-25x at ef=200", "top1_agreement": "96.7-98.3% / 99.2-99.6% / 99.8-99.9%",
     "token_speedup": "1.16x-1.82x"},
    {"source": "Loretz blog 2024-25", "model": "GPT-2 124M", "setting": "ef=100 / ef=200",
     "output_layer_speedup": "41x / 23x", "top1_agreement": "not given", "token_speedup": "1.34x (39 -> 29 ms)"},
]


def add_arguments(parser) -> None:
    parser.add_argument("--config", default=str(DEFAULT_GRID), help="grid TOML (default: experiments/05_output_layer/grid.toml)")
    parser.add_argument("--model", action="append", help="model(s) instead of the grid's: random, shipped, gpt2 or a folder")
    parser.add_argument("--kinds", nargs="+", help="only these index kinds of the grid")
    parser.add_argument("--out", default=None, help="results folder (default results/05_output_layer)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--merge", nargs="+", metavar="DIR",
                        help="run nothing: combine the results.json of these folders into --out (table and plot)")


def load_grid(path) -> dict:
    import tomllib

    from vecgpt.errors import VecgptError

    try:
        raw = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise VecgptError(f"grid {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise VecgptError(f"{path}: not valid TOML ({e})") from None
    cfg = {**DEFAULTS, **raw.get("experiment", {})}
    unknown = set(raw.get("experiment", {})) - set(DEFAULTS)
    if unknown:
        raise VecgptError(f"{path}: unknown [experiment] key {sorted(unknown)[0]!r}; known: {', '.join(DEFAULTS)}")
    cfg["index"] = raw.get("index", [])
    from vecgpt.output_index import KINDS

    for entry in cfg["index"]:
        if entry.get("kind") not in KINDS:
            raise VecgptError(f"{path}: [[index]] kind {entry.get('kind')!r} unknown; known: {', '.join(KINDS)}")
    return cfg


def load_model(name: str):
    from vecgpt import weights

    if name == "random":
        path = weights.default_models_dir() / RANDOM_DIR
        if not (path / "model.safetensors").is_file():
            print(f"writing a random GPT-2 small checkpoint to {path}", file=sys.stderr)
            weights.make_model(path, weights.HParams(n_layer=12, n_head=12, n_embd=768, n_ctx=1024, n_vocab=50257), seed=0)
        return weights.load(str(path)), "random GPT-2 small shape (seed 0)"
    if name == "shipped":
        return weights.load(None), "shipped demo model (vecgpt/models/shakespeare)"
    return weights.load(name), name


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
        L = H[s:s + 64].astype(np.float64) @ W64.T  # [c, V]
        part = np.argpartition(-L, k - 1, axis=1)[:, :k]
        for row, p in zip(L, part):
            tops.append(p[np.lexsort((p, -row[p]))])
        if targets is not None:
            mx = L.max(1)
            lse.append(mx + np.log(np.exp(L - mx[:, None]).sum(1)))
            t = targets[s:s + 64]
            tl.append(np.where(t < len(W), L[np.arange(len(L)), np.minimum(t, len(W) - 1)], np.nan))
    out = np.array(tops)
    return (out, np.concatenate(lse), np.concatenate(tl)) if targets is not None else out


def prepare(model, cfg) -> dict:
    from vecgpt import tokenizer
    from vecgpt.output_index import final_hidden
    from vecgpt.reference import Reference
    from vecgpt.sampling import top_k

    hp = model.hparams
    W = np.ascontiguousarray(model.params["wte"]["weight"][: cfg["vocab"] or None], np.float32)
    ref = Reference(model, np.float32)
    text = Path(cfg["corpus"]).read_text()
    held = tokenizer.encode(text[int(0.9 * len(text)):])
    win = min(cfg["window"], hp.n_ctx)
    starts = np.linspace(0, len(held) - win - 1, cfg["windows"]).astype(int)
    H, targets = [], []
    for s in starts:
        ref.reset()
        toks = held[s:s + win]
        H.append(final_hidden(ref, toks[:-1]))
        targets += toks[1:]
    H, targets = np.vstack(H).astype(np.float32), np.asarray(targets)
    top40, lse, tlogit = exact_top(H, W, 40, targets)
    # greedy decodes: the final vector at every step, and the exact argmax
    W64 = W.astype(np.float64)
    G, per_prompt, body = [], [], []
    for prompt in cfg["prompts"]:
        ids = tokenizer.encode(prompt)
        steps = min(cfg["steps"], hp.n_ctx - len(ids))
        ref.reset()
        h = final_hidden(ref, ids)[-1]
        toks = []
        for _ in range(steps):
            G.append(h.astype(np.float32))
            tok = int(np.argmax(W64 @ h.astype(np.float64)))
            toks.append(tok)
            t = time.perf_counter()
            h = final_hidden(ref, [tok])[-1]
            body.append(time.perf_counter() - t)
        per_prompt.append(steps)
    G = np.asarray(G, np.float32)
    g_top = np.argmax(G.astype(np.float64) @ W64.T, axis=1) if len(G) else np.zeros(0, np.int64)
    del W64
    # exact baselines at batch 1: numpy product + top-40, and the whole token with the exact head
    lat_H = H[: cfg["latency_queries"]]
    numpy_ms, numpy_p10 = latency_ms(lambda h: top_k(W @ h, 40), lat_H)
    whole_exact = whole_token_ms(lambda: ExactReader(ref, W), lambda r, tok: r.read([tok]), cfg, model)
    return {"W": W, "H": H, "targets": targets, "top40": top40, "lse": lse, "tlogit": tlogit, "G": G, "g_top": g_top,
            "per_prompt": per_prompt, "lat_H": lat_H, "numpy_ms": numpy_ms, "numpy_p10_ms": numpy_p10, "body_ms": 1e3 * float(np.median(body)),
            "whole_exact_ms": whole_exact, "frequent": frequent_tokens(cfg, len(W))}


class ExactReader:
    """The reference body with the exact output layer over W (float32 product + top-40, as Reference.read)."""

    def __init__(self, ref, W):
        self.ref, self.W = ref, W

    def read(self, ids, k: int = 40):
        from vecgpt.output_index import final_hidden
        from vecgpt.sampling import top_k

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
    from vecgpt.output_index import AnnReader, Head
    from vecgpt.reference import Reference

    W, k = data["W"], cfg["k"]
    head = Head(index, W, k, data["frequent"])
    V = len(W)

    raw, text_c = head.candidates_many(data["H"])
    top40 = data["top40"]
    rec = {n: float(np.mean([len(set(c.ids[:n]) & set(t[:n])) / n for c, t in zip(text_c, top40)])) for n in (1, 10, 40)}
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
    whole = whole_token_ms(lambda: AnnReader(Reference(model, np.float32), head), lambda r, tok: r.read([tok]), cfg, model)
    mem = index.memory_bytes()
    return {
        "candidates_mean": float(np.mean([len(c.ids) for c in text_c])),
        "recall@1": rec[1], "recall@10": rec[10], "recall@40": rec[40], "index_recall@10": raw_rec10,
        "top1_agreement": float(agree.mean()), "greedy_positions": int(len(agree)),
        "identical_steps": identical, "all_identical": float(np.mean([i == n for i, n in zip(identical, data["per_prompt"])])),
        **ppl,
        "head_ms": head_ms, "numpy_ms": data["numpy_ms"], "store_exact_ms": store_exact_ms,
        "speedup": data["numpy_ms"] / head_ms, "speedup_vs_store_exact": store_exact_ms / head_ms,
        "head_p10_ms": head_p10, "numpy_p10_ms": data["numpy_p10_ms"], "speedup_p10": data["numpy_p10_ms"] / head_p10,
        "token_ms": whole, "token_exact_ms": data["whole_exact_ms"], "token_speedup": data["whole_exact_ms"] / whole,
        "build_s": index.build_seconds, "index_MB": None if mem is None else mem / 1e6,
        "token_matrix_MB": W.nbytes / 1e6, "exact_scores": index.exact_scores, "store_exact": index.exact_label,
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
    return {"ppl_full": float(np.exp(np.mean(nll_full))),
            "ppl_candidates": float(np.exp(np.mean(nll_c))) if finite.all() else math.inf,
            "ppl_candidates_hits": float(np.exp(np.mean(nll_c[finite]))) if finite.any() else math.nan,
            "target_miss": float(np.mean(miss)), "ppl_floor": float(np.exp(np.mean(nll_floor)))}


def identical_steps(agree, per_prompt) -> list[int]:
    """Greedy steps identical to exact decoding, per prompt: the positions before the first top-1 disagreement."""
    out, pos = [], 0
    for n in per_prompt:
        a = agree[pos:pos + n]
        out.append(n if a.all() else int(np.argmin(a)))
        pos += n
    return out


# ---------------------------------------------------------------- the run

def run(args) -> int:
    from vecgpt.errors import VecgptError
    from vecgpt.experiments.common import provenance, results_dir, write_json
    from vecgpt.output_index import Unavailable, expand, make

    if args.merge:
        return merge(args.merge, results_dir("05_output_layer", args.out))
    cfg = load_grid(args.config)
    if args.threads:
        cfg["threads"] = args.threads
    out = results_dir("05_output_layer", args.out)
    entries = [e for e in cfg["index"] if not args.kinds or e["kind"] in args.kinds]
    rows, skipped, models = [], [], []
    result = {"provenance": provenance(cfg["seed"], grid=str(args.config), grid_values=dict(cfg)),
              "models": models, "rows": rows, "skipped": skipped, "published": PUBLISHED}
    for name in args.model or cfg["models"]:
        try:
            model, desc = load_model(name)
        except VecgptError as e:
            print(f"model {name}: skipped ({e})", file=sys.stderr)
            skipped.append({"model": name, "what": "model", "reason": str(e)})
            continue
        t = time.perf_counter()
        data = prepare(model, cfg)
        data["top1_frequent"] = float(np.isin(data["g_top"], data["frequent"]).mean())
        info = {"name": name, "description": desc, "source": model.source, "fingerprint": model.fingerprint,
                "hparams": model.hparams.__dict__, "output_vectors": len(data["W"]), "frequent": len(data["frequent"]),
                "text_positions": len(data["H"]), "greedy_positions": len(data["G"]), "numpy_ms": data["numpy_ms"],
                "numpy_p10_ms": data["numpy_p10_ms"], "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
                "top1_frequent": data["top1_frequent"],
                "body_ms": data["body_ms"], "token_exact_ms": data["whole_exact_ms"], "prepare_s": time.perf_counter() - t}
        models.append(info)
        print(f"model {name}: {len(data['W'])} x {data['W'].shape[1]} token vectors; exact numpy output layer "
              f"{data['numpy_ms']:.2f} ms, body {data['body_ms']:.1f} ms", file=sys.stderr)
        for entry in entries:
            for build, searches in expand(entry):
                try:
                    index = make(entry["kind"], threads=cfg["threads"], **build).build(data["W"])
                except Unavailable as e:
                    print(f"  {entry['kind']} {build}: skipped ({e})", file=sys.stderr)
                    skipped.append({"model": name, "what": f"{entry['kind']} {build}", "reason": str(e)})
                    continue
                try:
                    for search in searches:
                        index.set(**search)
                        row = {"model": name, "kind": entry["kind"], "label": index.label, "params": dict(index.params),
                               **evaluate(index, data, cfg, model)}
                        row["params"].pop("dsn", None)
                        rows.append(row)
                        print(f"  {index.label}: recall@10 {row['recall@10']:.3f}, top-1 {row['top1_agreement']:.3f}, "
                              f"{row['head_ms']:.2f} ms ({row['speedup']:.1f}x), build {row['build_s']:.1f} s",
                              file=sys.stderr)
                finally:
                    index.close()
                write_json(out / "results.json", result)  # partial results survive an interrupted grid
    write_json(out / "results.json", result)
    (out / "results.md").write_text(report(result))
    try:
        plot(rows, out / "output_layer.png")
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
    print(report(result))
    print(f"\nwrote {out}/results.json, results.md, output_layer.png", file=sys.stderr)
    return 0


def merge(folders, out) -> int:
    """One results.json / results.md / plot from several runs (e.g. kinds run in separate processes)."""
    import json

    from vecgpt.experiments.common import write_json

    parts = [json.loads((Path(f) / "results.json").read_text()) for f in folders]
    models = [m for p in parts for m in p["models"]]  # one entry per run: each has its own exact baseline
    result = {"provenance": parts[0]["provenance"], "merged_from": [str(f) for f in folders], "models": models,
              "rows": [r for p in parts for r in p["rows"]], "skipped": [s for p in parts for s in p["skipped"]],
              "published": PUBLISHED}
    write_json(out / "results.json", result)
    (out / "results.md").write_text(report(result))
    plot(result["rows"], out / "output_layer.png")
    print(report(result))
    return 0


COLUMNS = ["label", "cand", "recall@1", "recall@10", "recall@40", "top1_agreement", "identical", "ppl_full",
           "ppl_cand", "miss", "ppl_floor", "head_ms", "exact_ms", "speedup", "p10_x", "vs_store", "token_ms", "token_x", "build_s", "index_MB"]


def table_rows(rows):
    for r in rows:
        yield {"label": r["label"], "cand": f"{r['candidates_mean']:.0f}", "recall@1": r["recall@1"],
               "recall@10": r["recall@10"], "recall@40": r["recall@40"], "top1_agreement": f"{100 * r['top1_agreement']:.1f}%",
               "identical": f"{sum(r['identical_steps'])}/{r['greedy_positions']}", "ppl_full": r["ppl_full"],
               "ppl_cand": r["ppl_candidates"], "miss": f"{100 * r['target_miss']:.1f}%", "ppl_floor": r["ppl_floor"],
               "head_ms": r["head_ms"], "exact_ms": r["numpy_ms"], "speedup": f"{r['speedup']:.1f}x",
               "p10_x": f"{r['speedup_p10']:.1f}x" if "speedup_p10" in r else "",
               "vs_store": f"{r['speedup_vs_store_exact']:.1f}x ({r['store_exact']})",
               "token_ms": r["token_ms"], "token_x": f"{r['token_speedup']:.2f}x", "build_s": r["build_s"],
               "index_MB": r["index_MB"]}


def report(result) -> str:
    from vecgpt.experiments.common import markdown_table

    prov = result["provenance"]
    lines = ["# Output layer as an ANN search", "",
             f"Machine: {prov['machine']['system']}, {prov['machine']['cores']} cores; commit {prov['commit']}.",
             "Speedup = exact numpy output layer (`exact_ms`: float32 `h @ wte.T` + top-40, measured in the same "
             "run) / index head (search k + frequent tokens + exact rescoring), both batch 1, medians (`p10_x`: "
             "the same from 10th percentiles, closer to an unloaded machine). `identical` = greedy steps "
             "identical to exact decoding, summed over prompts. ppl_cand: softmax over the candidates only (inf when a target is "
             "missing; `miss` = such positions); ppl_floor: every missing token gets the lowest candidate logit.", ""]
    for name in dict.fromkeys(m["name"] for m in result["models"]):
        runs = [m for m in result["models"] if m["name"] == name]
        rows = [r for r in result["rows"] if r["model"] == name]
        lines += [f"## {runs[0]['description']}", ""]
        for m in runs:
            lines += [f"{m['output_vectors']} x {m['hparams']['n_embd']} token vectors; {m['text_positions']} held-out "
                      f"positions, {m['greedy_positions']} greedy positions; exact numpy output layer {m['numpy_ms']:.2f} ms, "
                      f"rest of the token {m['body_ms']:.1f} ms, exact whole token {m['token_exact_ms']:.1f} ms; "
                      f"BLAS threads {m.get('blas_threads')}."
                      + (f" The exact top-1 is an always-scored token at {100 * m['top1_frequent']:.0f}% of greedy positions."
                         if m.get("top1_frequent") is not None else ""), ""]
        if rows:
            lines += [markdown_table(list(table_rows(rows)), COLUMNS), ""]
    if result["skipped"]:
        lines += ["## Skipped", ""] + [f"- {s['model']}: {s['what']}: {s['reason']}" for s in result["skipped"]] + [""]
    lines += ["## Published figures (not measured here)", "", markdown_table(result["published"]), ""]
    return "\n".join(lines)


def pareto(points):
    """Indices of points (x, y) no other point beats on both (higher is better on both)."""
    return [i for i, (x, y) in enumerate(points)
            if not any((x2 >= x and y2 >= y) and (x2 > x or y2 > y) for x2, y2 in points)]


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["model"] for r in rows))
    if not names:
        return
    fig, axes = plt.subplots(1, len(names), figsize=(6.5 * len(names), 4.8), squeeze=False)
    for ax, name in zip(axes[0], names):
        rs = [r for r in rows if r["model"] == name]
        for kind in dict.fromkeys(r["kind"] for r in rs):
            ks = [r for r in rs if r["kind"] == kind]
            ax.scatter([r["speedup"] for r in ks], [r["recall@10"] for r in ks], label=kind, alpha=0.8)
        pts = [(r["speedup"], r["recall@10"]) for r in rs]
        front = sorted((pts[i] for i in pareto(pts)))
        ax.plot([p[0] for p in front], [p[1] for p in front], "k--", lw=1, label="Pareto front")
        ax.scatter([p[0] for p in front], [p[1] for p in front], s=120, facecolors="none", edgecolors="k")
        ax.axvline(1, color="grey", lw=0.5)
        ax.set_xscale("log")
        ax.set_xlabel("output-layer speedup over exact numpy (batch 1)")
        ax.set_ylabel("recall@10 vs exact top-10")
        ax.set_title(f"model: {name}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=HELP)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
