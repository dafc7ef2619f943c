"""Attention policies (issue 53): which choice of earlier keys reads least at 99% greedy agreement?

Policies (vecgpt.policy): top-k (K), a threshold (beta: every key within beta of the best), sinks plus a window
(S, W), sinks plus a window plus top-k, and top-k by an HNSW index (numpy's hnswlib; FAISS's through the stores).
In numpy float64 against full attention (measure.py, sparse_forward.py: reference.keep's sets), on windows of the
tenth of Tiny Shakespeare the shipped model did not train on: per context length and policy, greedy agreement, KL,
the attention mass the kept keys hold, keys returned, values read and keys scored a token, and a threshold's
worst-case dropped weight; each family's 99% point by bisection (policies.py). Through the stores (stores.py,
--configs; turbopuffer on its local server): keys returned, values read, requests, store time, round trips and
dollars a token. Writes topk_attention.json, .md and .png to ./results/topk-attention/<timestamp>/ (or --out).
--models A B compares models on the same passages (compare.py: top-k and the threshold, and the first positions'
weight, sinks.py), GPT-2 or Llama (sparse_llama.py); writes topk_compare.json, .md and .png.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# One BLAS thread (unless set): the forward pass's many small products stall a second thread on a shared machine.
# As a script this runs before numpy loads; under `vecgpt experiment` numpy is loaded already.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # this experiment's modules, and experiments/ for common/

import numpy as np  # noqa: E402
from measure import ALL, k_arg  # noqa: E402

from common import subjects  # noqa: E402

NAME = "topk-attention"
HELP = "attention policies (top-k, threshold, sinks + window, HNSW): agreement, KL, mass and keys read a token"
KS = [1, 2, 4, 8, 16, 32, 64, 128, 192, ALL]
THRESHOLDS = [0.5, 1, 2, 3, 4, 6, 8]
WINDOWS = [4, 8, 16, 32, 64, 128, 192, 224]
CONTEXTS = [64, 128, 192, 255]
QUICK = {
    "contexts": [16, 24],
    "span": 4,
    "passages": 1,
    "steps": 3,
    "ks": [1, ALL],
    "thresholds": [0.5, 4.0],
    "windows": [2, 8],
    "window_k": 2,
    "hnsw_ks": [2],
    "approx_windows": 2,
    "refine_probes": 2,
}
REPO = HERE.parents[1]


def add_arguments(p) -> None:
    p.add_argument("--model", default=None, help="model folder, shipped name, hub name, or random-small (shipped)")
    p.add_argument("--corpus", default=None, help="Tiny Shakespeare (default: data/tinyshakespeare.txt, /work/shared)")
    p.add_argument("--contexts", type=int, nargs="+", default=CONTEXTS, help="context lengths (64 128 192 255)")
    p.add_argument("--span", type=int, default=8, help="queries a window gives each context: C - span .. C - 1 (8)")
    p.add_argument("--passages", type=int, default=32, help="held-out passages (32)")
    p.add_argument("--steps", type=int, default=4, help="windows a passage, one token apart (4)")
    p.add_argument("--ks", nargs="+", default=[str(k) for k in KS], help="top-k's K, 'all' for every key")
    p.add_argument("--thresholds", type=float, nargs="+", default=THRESHOLDS, help="the threshold's beta")
    p.add_argument("--sinks", type=int, default=4, help="S of the sinks + window policies (4)")
    p.add_argument("--windows", type=int, nargs="+", default=WINDOWS, help="W of the sinks + window policies")
    p.add_argument("--window-k", type=int, default=16, help="K of sinks + window + top-k (16)")
    p.add_argument("--hnsw-ks", type=int, nargs="*", default=[8, 32, 128, 192], help="K of numpy's hnswlib search")
    p.add_argument("--approx-windows", type=int, default=16, help="windows the hnswlib search reads (16)")
    p.add_argument("--hnsw-m", type=int, default=16)
    p.add_argument("--hnsw-ef-construction", type=int, default=64)
    p.add_argument("--hnsw-ef", type=int, default=16, help="search breadth: max(this, K) (16)")
    p.add_argument("--refine-probes", type=int, default=3, help="bisection probes a family and context (3)")
    p.add_argument("--configs", nargs="*", default=[], help="stores to run the policies on (TOML configs)")
    p.add_argument("--store-contexts", type=int, nargs="+", default=[64, 255], help="contexts on the stores")
    p.add_argument("--store-tokens", type=int, default=8, help="tokens generated a text on a store (8)")
    p.add_argument("--store-root", default=None, help="put each store under DIR/<config name>")
    p.add_argument("--latency-ms", type=float, default=25.0, help="the local turbopuffer server's delay (25)")
    p.add_argument("--stores-from", metavar="DIR", help="no numpy sweep: the policies of the run in DIR, its figures")
    p.add_argument("--quick", action="store_true", help="one short passage, few policies (the test's run)")
    p.add_argument("--models", nargs="+", default=None, help="compare these models (top-k, threshold, sinks)")
    p.add_argument("--sinks-measured", dest="sinks_measured", type=int, default=4, help="--models: S, positions 0..S-1")
    p.add_argument("--seed", type=int, default=0, help="hnswlib's graph seed")
    p.add_argument("--out", default=None, help="results folder (default: a new ./results/topk-attention/<timestamp>)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def settings(args) -> dict:
    names = ("contexts", "span", "passages", "steps", "thresholds", "sinks", "windows", "window_k", "hnsw_ks")
    s = {name: getattr(args, name) for name in names}
    s.update(ks=[k_arg(k) for k in args.ks], approx_windows=args.approx_windows, refine_probes=args.refine_probes)
    if args.quick:
        s.update(QUICK)
    s["contexts"] = sorted(s["contexts"])
    s["hnsw"] = {"m": args.hnsw_m, "ef_construction": args.hnsw_ef_construction, "ef": args.hnsw_ef, "seed": args.seed}
    s.update(quick=args.quick, dtype="float64", teacher_forced=True)
    return s


def load_windows(args, s, hp):
    """The windows [passages x steps, longest]: window j of a passage starts at its token j."""
    from passages import QUICK_TEXT, cut, find_corpus, held_out_tokens

    from vecgpt import tokenizer
    from vecgpt.errors import VecgptError

    longest, span = max(s["contexts"]), s["span"]
    if longest > hp.n_ctx or min(s["contexts"]) <= span or np.diff(s["contexts"]).min(initial=span) < span:
        raise VecgptError(
            f"context lengths must be {span + 1} to the model's {hp.n_ctx} tokens, at least --span {span} apart; "
            f"not {s['contexts']}"
        )
    if args.quick and not args.corpus:
        tokens, source = np.asarray(tokenizer.encode(QUICK_TEXT), np.int64), "passages.QUICK_TEXT"
    else:
        path = find_corpus(args.corpus, REPO)
        tokens, source = held_out_tokens(path), f"{path} (last 10% of characters)"
    s["corpus"] = source
    if tokens.max() >= hp.n_vocab:  # a random model with a small vocabulary: any ids will do
        tokens = tokens % hp.n_vocab
        s["corpus"] += f"; token ids folded into the model's {hp.n_vocab} (id mod {hp.n_vocab})"
    passages = cut(tokens, s["passages"], longest + s["steps"])
    return np.concatenate([passages[:, j : j + longest] for j in range(s["steps"])]), passages


def run(args) -> int:
    from common.record import new_run, provenance

    if args.stores_from:
        return stores_run(args, new_run(NAME, args.out))
    if args.models:
        from compare import run_compare

        return run_compare(args, sys.modules[__name__])
    s = settings(args)
    model = subjects.load_model(args.model, dtype=np.float64)
    windows, passages = load_windows(args, s, model.hparams)
    out = new_run(NAME, args.out)
    result = {
        "provenance": provenance(args.seed, model, settings=s),
        "settings": s,
        "model": {"label": subjects.model_label(model, args.model), "name": args.model or "shakespeare"},
        "stores": [],
        "stores_skipped": [],
    }
    numpy_half(result, model, windows, passages, args.quiet, out)
    if args.configs:
        from stores import run_stores

        run_stores(args, s, subjects.load_model(args.model), model, passages, result)
    publish(out, result)
    return 0


def numpy_half(result, model, windows, passages, quiet, out) -> dict:
    """Full attention once, every family's grid, numpy's hnsw, the bisection, and each context's fewest keys; full
    attention's figures returned (measure.full_attention). out None: no partial figures written."""
    import time

    from measure import Steps, full_attention
    from policies import bisect, fewest, hnsw_rows, sweep

    from common.record import write_json

    s, t = result["settings"], time.perf_counter()
    steps = Steps(windows, s["contexts"], s["span"])
    full = full_attention(model, steps)
    greedy = full["greedy"].reshape(s["steps"], s["passages"], -1)  # windows: step-major
    targets = np.stack([passages[:, j + 1 : j + 1 + max(s["contexts"])] for j in range(s["steps"])])
    result["full_accuracy"] = {
        str(c): float((greedy[..., steps.at(c)] == targets[..., steps.positions[steps.at(c)]]).mean())
        for c in s["contexts"]
    }
    result["rows"] = sweep(model, steps, full, s, quiet)
    if out is not None:
        write_json(out / "topk_attention.json", result)  # partial figures survive an interrupted run
    result["rows"] += hnsw_rows(model, steps, full, s, quiet)
    bisect(model, steps, full, s, result["rows"], quiet)
    result["fewest"] = {str(c): summary(fewest(result["rows"], c)) for c in s["contexts"]}
    result["fewest_hnsw"] = {str(c): summary(fewest(result["rows"], c, "hnsw")) for c in s["contexts"]}
    result["answer"] = answer(result)
    result["numpy_seconds"] = time.perf_counter() - t
    return full


def summary(best: dict) -> dict:
    keys = ("label", "value", "policy", "agreement", "steps", "kl_mean", "mass_mean", "per_token")
    return {family: {k: r[k] for k in keys} for family, r in best.items()}


def answer(result) -> dict:
    """At 99% agreement: per context, the family reading the fewest keys a token, those keys and every key's."""
    out = {}
    for c, best in result["fewest"].items():
        every = max(r["per_token"]["keys_returned"] for r in result["rows"] if r["context"] == int(c))
        if best:
            family = min(best, key=lambda f: best[f]["per_token"]["keys_returned"])
            keys = best[family]["per_token"]["keys_returned"]
            out[c] = {"family": family, "label": best[family]["label"], "keys_returned": keys, "every_key": every}
        else:
            out[c] = None
    return out


def stores_run(args, out) -> int:
    """--stores-from DIR: that run's numpy figures, and its policies through the stores of --configs."""
    import json

    from stores import run_stores

    result = json.loads((Path(args.stores_from) / "topk_attention.json").read_text())
    result.update(stores=[], stores_skipped=[], stores_from=str(args.stores_from))
    s = result["settings"]
    args.quick, args.corpus = s["quick"], args.corpus
    model64 = subjects.load_model(args.model, dtype=np.float64)
    _, passages = load_windows(args, dict(s), model64.hparams)
    run_stores(args, s, subjects.load_model(args.model), model64, passages, result)
    publish(out, result)
    return 0


def publish(out, result) -> None:
    from report import plot, report

    from common import plots
    from common.record import say_written, write_json

    write_json(out / "topk_attention.json", result)
    md = report(result)
    (out / "topk_attention.md").write_text(md)
    drawn = plots.draw({"topk_attention.png": lambda: plot(result, out / "topk_attention.png")})
    print(md)
    say_written(out, ["topk_attention.json", "topk_attention.md", *drawn])


def main(argv=None) -> int:
    import common

    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
