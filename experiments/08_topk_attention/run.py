"""Top-k attention (issue 48): how few earlier keys does each query need?

Each query's softmax runs over its own key and its K best earlier keys by q.k (vecgpt.reference.keep_top_k), in
numpy float64 against full attention, on passages of the tenth of Tiny Shakespeare the shipped model did not train
on, at several context lengths. Per context length and K: the greedy agreement with full attention over
teacher-forced steps (every step reads exactly `context` tokens of the passage), the mean KL divergence of the
next-token distribution from full attention's, the attention mass the kept keys hold under full attention per
layer and head, keys returned and values read a token (by formula, and from the engine's meter on the stores), and
the smallest K at which 99% of steps agree. Beside the exact search, an HNSW index (hnswlib, in numpy: not a
store's search) over each head's keys: its recall of the exact top K and the agreement that results. Through the
stores (configs given with --configs, `attention_top_k` set): ms a token and the meter's counts. Writes
topk_attention.json, .md, .png and mass.png to ./results/topk-attention/<timestamp>/ (or --out).

The measurements are in measure.py (numpy) and stores.py (the engine), the tables and plots in report.py.
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
from measure import ALL, k_arg, per_token, run_context, smallest_k  # noqa: E402

from common import subjects  # noqa: E402

NAME = "topk-attention"
HELP = "attention over each query's K best earlier keys: agreement, KL and mass against full attention, by K"
KS = [1, 2, 4, 8, 16, 32, 64, 128, 192, ALL]  # the 1-64 and all, and two between 64 and 254 keys
CONTEXTS = [64, 128, 255]
QUICK = {"contexts": [24], "ks": [1, ALL], "passages": 1, "steps": 8, "approx_passages": 1}
REPO = HERE.parents[1]


def add_arguments(p) -> None:
    p.add_argument(
        "--model", default=None, help="model folder, shipped name, hub name, or random-small (default: shipped)"
    )
    p.add_argument(
        "--corpus", default=None, help="Tiny Shakespeare (default: data/tinyshakespeare.txt, or /work/shared/data)"
    )
    p.add_argument("--contexts", type=int, nargs="+", default=CONTEXTS, help="context lengths in tokens (64 128 255)")
    p.add_argument("--ks", nargs="+", default=[str(k) for k in KS], help="K values, 'all' for every key")
    p.add_argument("--passages", type=int, default=32, help="held-out passages per context length (32)")
    p.add_argument("--steps", type=int, default=32, help="teacher-forced steps per passage (32)")
    p.add_argument("--approx-passages", type=int, default=4, help="passages the hnsw search also reads (4)")
    p.add_argument("--approx-max-k", type=int, default=64, help="the largest K the hnsw search runs (64)")
    p.add_argument("--hnsw-m", type=int, default=16)
    p.add_argument("--hnsw-ef-construction", type=int, default=64)
    p.add_argument("--hnsw-ef", type=int, default=16, help="search breadth: max(this, K) (16)")
    p.add_argument("--configs", nargs="*", default=[], help="stores to time with attention_top_k (TOML configs)")
    p.add_argument("--store-ks", nargs="+", default=None, help="K values on the stores (default: --ks)")
    p.add_argument("--store-tokens", type=int, default=16, help="tokens generated a text on a store (16)")
    p.add_argument("--store-repeats", type=int, default=3, help="texts a store, context and K (3; median ms)")
    p.add_argument("--store-root", default=None, help="put each store under DIR/<config name>")
    p.add_argument(
        "--store-agreement-ks",
        nargs="*",
        default=["4", "16", "64"],
        help="Ks whose teacher-forced steps also run through each store, a text a step (4 16 64)",
    )
    p.add_argument("--store-passages", type=int, default=1, help="passages those steps come from (1)")
    p.add_argument("--stores-only", action="store_true", help="only the stores' half (no numpy sweep)")
    p.add_argument(
        "--merge",
        nargs="+",
        metavar="DIR",
        help="run nothing: the numpy figures of the first run folder with the stores of the others, into --out",
    )
    p.add_argument("--refine-probes", type=int, default=4, help="Ks bisected below the smallest reaching 99%% (4)")
    p.add_argument(
        "--refine", metavar="DIR", help="run nothing else: bisect the thresholds of the run in DIR, into --out"
    )
    p.add_argument(
        "--quick", action="store_true", help="one short passage (of --corpus if given), K in 1 and all (the test's run)"
    )
    p.add_argument("--seed", type=int, default=0, help="hnswlib's graph seed")
    p.add_argument("--out", default=None, help="results folder (default: a new ./results/topk-attention/<timestamp>)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def settings(args) -> dict:
    s = {
        "contexts": args.contexts,
        "ks": [k_arg(k) for k in args.ks],
        "passages": args.passages,
        "steps": args.steps,
        "approx_passages": args.approx_passages,
    }
    if args.quick:
        s.update(QUICK)
    s["ks"] = sorted(s["ks"], key=lambda k: float("inf") if k == ALL else k)
    s["approx_max_k"] = args.approx_max_k
    s["hnsw"] = {"m": args.hnsw_m, "ef_construction": args.hnsw_ef_construction, "ef": args.hnsw_ef, "seed": args.seed}
    s.update(quick=args.quick, dtype="float64", teacher_forced=True)
    return s


def load_passages(args, s, hp):
    from passages import QUICK_TEXT, cut, find_corpus, held_out_tokens

    from vecgpt import tokenizer
    from vecgpt.errors import VecgptError

    longest = max(s["contexts"])
    if longest > hp.n_ctx or min(s["contexts"]) < 2:
        raise VecgptError(f"context lengths must be 2 to the model's {hp.n_ctx} tokens, not {s['contexts']}")
    if args.quick and not args.corpus:  # a --corpus given is read, quick or not
        tokens, source = np.asarray(tokenizer.encode(QUICK_TEXT), np.int64), "passages.QUICK_TEXT"
    else:
        path = find_corpus(args.corpus, REPO)
        tokens, source = held_out_tokens(path), f"{path} (last 10% of characters)"
    s["corpus"] = source
    if tokens.max() >= hp.n_vocab:  # a random model with a small vocabulary: any ids will do
        tokens = tokens % hp.n_vocab
        s["corpus"] += f"; token ids folded into the model's {hp.n_vocab} (id mod {hp.n_vocab})"
    return cut(tokens, s["passages"], longest + s["steps"])


def run(args) -> int:
    from common.record import new_run, provenance, write_json

    if args.merge:
        return merge(args.merge, new_run(NAME, args.out))
    if args.refine:
        return refine_run(args, new_run(NAME, args.out))
    s = settings(args)
    model = subjects.load_model(args.model, dtype=np.float64)
    passages = load_passages(args, s, model.hparams)
    out = new_run(NAME, args.out)
    result = {
        "provenance": provenance(args.seed, model, settings=s),
        "settings": s,
        "model": {"label": subjects.model_label(model, args.model), "name": args.model or "shakespeare"},
        "rows": [],
        "mass": {},  # per context: [K of ks_run, layer, head]
        "ks_run": {},  # per context: the Ks run (none above the context)
        "full_accuracy": {},
        "stores": [],
        "stores_skipped": [],
    }
    hnsw = {"m": s["hnsw"]["m"], "ef_construction": s["hnsw"]["ef_construction"], "ef": s["hnsw"]["ef"]}
    for context in [] if args.stores_only else s["contexts"]:
        ks = [k for k in s["ks"] if k == ALL or k <= context]  # a larger K keeps what `all` keeps
        approx = (s["approx_passages"], args.approx_max_k)
        got = run_context(model, passages, context, ks, s["steps"], approx, hnsw, args.quiet)
        add_context(result, model.hparams, context, ks, got)
        write_json(out / "topk_attention.json", result)  # partial figures survive an interrupted run
    result["smallest_k"] = {str(c): smallest_k(result["rows"], c) for c in s["contexts"]}
    result["smallest_k_hnsw"] = {str(c): smallest_k(result["rows"], c, search="hnsw") for c in s["contexts"]}
    refine(result, model, passages, args.refine_probes, args.quiet)
    from stores import run_stores, turbopuffer_dollars

    result["turbopuffer_dollars"] = turbopuffer_dollars(model, s["contexts"], s["ks"])
    if args.configs:
        run_stores(args, s, model, passages, result)
    publish(out, result)
    return 0


def refine(result, model, passages, probes, quiet) -> None:
    """Bisect between the sweep's last K below 99% agreement and its first reaching it, per context."""
    from measure import bisect_bounds, bisect_k

    result["refined"] = {}
    for context in result["ks_run"]:
        bounds = bisect_bounds(result["rows"], int(context))
        if bounds is None or not probes:
            continue
        rows, lo, hi = bisect_k(model, passages, int(context), *bounds, result["settings"]["steps"], probes)
        result["refined"][context] = {"sweep": list(bounds), "lo": lo, "hi": hi, "probes": rows}
        if not quiet:
            print(f"  context {context}: 99% agreement reached at K {hi}, not at {lo}", file=sys.stderr)


def refine_run(args, out) -> int:
    """--refine DIR: bisect an earlier run's thresholds on its own passages, and write it again to --out."""
    import json

    result = json.loads((Path(args.refine) / "topk_attention.json").read_text())
    s = result["settings"]
    args.quick, args.corpus = s["quick"], args.corpus
    model = subjects.load_model(
        None if result["model"]["name"] == "shakespeare" else result["model"]["name"], np.float64
    )
    passages = load_passages(args, dict(s), model.hparams)
    contexts = [int(c) for c in result["ks_run"]]  # an interrupted run has no smallest K yet
    result["smallest_k"] = {str(c): smallest_k(result["rows"], c) for c in contexts}
    result["smallest_k_hnsw"] = {str(c): smallest_k(result["rows"], c, search="hnsw") for c in contexts}
    result["settings"]["contexts"] = contexts
    refine(result, model, passages, args.refine_probes, args.quiet)
    result["refined_from"] = str(args.refine)
    publish(out, result)
    return 0


def add_context(result, hp, context, ks, got) -> None:
    mass = got["mass"]  # [K, L, H]
    result["mass"][str(context)] = mass
    result["ks_run"][str(context)] = ks
    result["full_accuracy"][str(context)] = got["full_accuracy"]
    for i, k in enumerate(ks):
        result["rows"].append(
            {
                "context": context,
                "k": k,
                "search": "exact",
                **got["exact"][k].row(),
                "mass_mean": float(mass[i].mean()),
                "mass_min_head": float(mass[i].min()),
                "per_token": with_bytes(per_token(hp, context, k), hp),
            }
        )
    for k, tally in got["hnsw"].items():
        same = got["exact_on_hnsw_passages"][k].row()
        result["rows"].append(
            {
                "context": context,
                "k": k,
                "search": "hnsw",
                **tally.row(),
                "exact_agreement_same_steps": same["agreement"],
                "exact_kl_same_steps": same["kl_mean"],
            }
        )


def merge(folders, out) -> int:
    """One result from several runs of one model: each context's numpy figures from the run that has it (runs over
    different context lengths), every run's stores."""
    import json

    runs = [json.loads((Path(f) / "topk_attention.json").read_text()) for f in folders]
    result = {**runs[0], "merged_from": [str(f) for f in folders], "provenance": [r["provenance"] for r in runs]}
    for key in ("mass", "ks_run", "full_accuracy", "refined"):
        result[key] = {c: v for r in runs for c, v in r.get(key, {}).items() if c in r["ks_run"]}
    contexts = sorted({int(c) for r in runs for c in r["ks_run"]})
    result["rows"] = sorted((row for r in runs for row in r["rows"]), key=lambda row: row["context"])
    result["smallest_k"] = {str(c): smallest_k(result["rows"], c) for c in contexts}
    result["smallest_k_hnsw"] = {str(c): smallest_k(result["rows"], c, search="hnsw") for c in contexts}
    result["settings"] = {**runs[0]["settings"], "contexts": contexts}
    result["settings"]["approx_passages"] = {c: r["settings"]["approx_passages"] for r in runs for c in r["ks_run"]}
    for key in ("stores", "stores_skipped"):
        result[key] = [row for r in runs for row in r.get(key, [])]
    dollars = {(d["context"], str(d["k"])): d for r in runs for d in r.get("turbopuffer_dollars", [])}
    result["turbopuffer_dollars"] = sorted(dollars.values(), key=lambda d: d["context"])  # K order kept within
    publish(out, result)
    return 0


def with_bytes(counts: dict, hp) -> dict:
    """Bytes a token: 12 a returned key (an 8-byte id and a 4-byte score), and a float32 value a value read (layout
    five, the in-process default: a head's width; four and three keep values projected, n_embd wide)."""
    return {
        **counts,
        "bytes_returned": 12 * counts["keys_returned"],
        "value_bytes": 4 * (hp.n_embd // hp.n_head) * counts["values_read"],
    }


def publish(out, result) -> None:
    from report import mass_plot, plot, report

    from common import plots
    from common.record import say_written, write_json

    write_json(out / "topk_attention.json", result)
    md = report(result)
    (out / "topk_attention.md").write_text(md)
    figures = {  # a stores-only run has no numpy figures to draw
        "topk_attention.png": lambda: plot(result, out / "topk_attention.png"),
        "mass.png": lambda: mass_plot(result, out / "mass.png"),
    }
    drawn = plots.draw(figures if result["rows"] else {})
    print(md)
    say_written(out, ["topk_attention.json", "topk_attention.md", *drawn])


def main(argv=None) -> int:
    import common

    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
