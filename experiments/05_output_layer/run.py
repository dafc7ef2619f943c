"""Output layer as an ANN search (issue 7): what an index over the token vectors buys and costs.

For each model and each index setting of a grid (experiments/05_output_layer/grid.toml):
recall@1/@10/@40 against the exact top-40, top-1 agreement over greedy decodes, greedy steps
identical to exact decoding, perplexity with the softmax over the candidates only versus the full
softmax, output-layer latency against the exact numpy product and the same store's exact search,
whole-token latency, build time and index memory. Writes results.json, results.md and
output_layer.png to ./results/output-layer/<timestamp>/ (or --out).

The hidden states come from the numpy reference (float32), the exact logits from float64 products
of those float32 vectors. Greedy identity needs no second decode: an index decode is the exact
decode until the first position where its top-1 differs, so the identical prefix is the number of
steps before the first disagreement along the exact trajectory.

The measurements are in output_metrics.py, the tables and the plot in output_report.py.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

# One BLAS thread (unless set): the exact product is then timed on one core like the index searches (batch 1),
# and a shared machine's load does not stall a second BLAS thread (on the 2-core VM that tripled its time).
# As a script this runs before numpy loads; under `vecgpt experiment` numpy is loaded already.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # this experiment's modules, and experiments/ for common/

import numpy as np  # noqa: E402

from common import subjects  # noqa: E402
from output_metrics import evaluate, prepare  # noqa: E402
from output_report import pareto, plot, report  # noqa: E402, F401 - pareto: tests use it from here

NAME = "output-layer"
HELP = "the output layer as an ANN search (hnswlib, FAISS, LanceDB, pgvector): recall, agreement, speed"
DEFAULT_GRID = HERE / "grid.toml"
CORPUS = "data/tinyshakespeare.txt"  # relative to the grid's folder, unless absolute or given as --corpus
CORPUS_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"

DEFAULTS = {
    "models": ["random"],  # "random" (GPT-2 small shape, random weights), "shipped", "gpt2", or a folder
    "k": 50,  # candidates asked of the index (the paper's 50)
    "frequent": 64,  # most frequent training tokens always scored exactly (plus <|endoftext|>)
    "vocab": 0,  # >0: only the first `vocab` token vectors form the output layer (tiny test grids)
    "corpus": CORPUS,  # first 90% counts frequent tokens, last 10% is held out
    "windows": 4,
    "window": 64,  # held-out windows for recall and perplexity (positions = windows * (window-1))
    "prompts": ["ROMEO:", "First Citizen:\nBefore we proceed any further,", "The king is dead", "To be, or not"],
    "steps": 32,  # greedy steps per prompt
    "latency_queries": 100,  # positions timed one at a time for output-layer latency
    "whole_steps": 16,  # decode steps timed for whole-token latency
    "threads": 2,  # index builds; searches run on one thread (batch 1)
    "seed": 0,
}

PUBLISHED = [
    {
        "source": "Loretz et al. 2026",
        "model": "Gemma-3-270M",
        "setting": "hnswlib M=32 efc=5000 ef=200, k=50",
        "output_layer_speedup": "23.9x (38.3 -> 1.6 ms)",
        "top1_agreement": "99.2-99.6% (range over models)",
        "token_speedup": "1.82x",
    },
    {
        "source": "Loretz et al. 2026",
        "model": "Gemma / Llama / Qwen (range)",
        "setting": "ef=100 / 200 / 400",
        "output_layer_speedup": "13x-25x at ef=200",
        "top1_agreement": "96.7-98.3% / 99.2-99.6% / 99.8-99.9%",
        "token_speedup": "1.16x-1.82x",
    },
    {
        "source": "Loretz blog 2024-25",
        "model": "GPT-2 124M",
        "setting": "ef=100 / ef=200",
        "output_layer_speedup": "41x / 23x",
        "top1_agreement": "not given",
        "token_speedup": "1.34x (39 -> 29 ms)",
    },
]


def add_arguments(parser) -> None:
    parser.add_argument(
        "--config", default=str(DEFAULT_GRID), help="grid TOML (default: experiments/05_output_layer/grid.toml)"
    )
    parser.add_argument(
        "--model", action="append", help="model(s) instead of the grid's: random, shipped, gpt2 or a folder"
    )
    parser.add_argument("--kinds", nargs="+", help="only these index kinds of the grid")
    parser.add_argument(
        "--corpus",
        default=None,
        help=f"text for frequent tokens and held-out windows (default: the "
        f"grid's corpus, {CORPUS} beside the grid: tinyshakespeare, {CORPUS_URL})",
    )
    parser.add_argument(
        "--out", default=None, help="results folder (default: a new ./results/output-layer/<timestamp>)"
    )
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="DIR",
        help="run nothing: combine the results.json of these folders into --out (table and plot)",
    )


def load_grid(path) -> dict:
    from vecgpt.config import read_toml
    from vecgpt.errors import VecgptError

    raw = read_toml(path, "grid")
    cfg = {**DEFAULTS, **raw.get("experiment", {})}
    unknown = set(raw.get("experiment", {})) - set(DEFAULTS)
    if unknown:
        raise VecgptError(f"{path}: unknown [experiment] key {sorted(unknown)[0]!r}; known: {', '.join(DEFAULTS)}")
    cfg["index"] = raw.get("index", [])
    cfg["corpus"] = str(Path(path).resolve().parent / cfg["corpus"])  # an absolute corpus stays as it is
    from output_index import KINDS

    for entry in cfg["index"]:
        if entry.get("kind") not in KINDS:
            raise VecgptError(f"{path}: [[index]] kind {entry.get('kind')!r} unknown; known: {', '.join(KINDS)}")
    return cfg


def check_corpus(path: str) -> str:
    from vecgpt.errors import VecgptError

    if not Path(path).is_file():
        raise VecgptError(f"no corpus at {path}: download tinyshakespeare ({CORPUS_URL}) there, or give --corpus PATH")
    return path


def load_model(name: str):
    from vecgpt import weights

    if name == "random":
        return subjects.load_model(subjects.RANDOM_SMALL), "random GPT-2 small shape (seed 0)"
    if name == "shipped":
        return weights.load(None), "shipped demo model (vecgpt/models/shakespeare)"
    return weights.load(name), name


# ---------------------------------------------------------------- the run


def run(args) -> int:

    from common.record import new_run, provenance

    if args.merge:
        return merge(args.merge, new_run(NAME, args.out))
    cfg = load_grid(args.config)
    if args.threads:
        cfg["threads"] = args.threads
    cfg["corpus"] = check_corpus(args.corpus or cfg["corpus"])
    out = new_run(NAME, args.out)
    entries = [e for e in cfg["index"] if not args.kinds or e["kind"] in args.kinds]
    result = {
        "provenance": provenance(cfg["seed"], grid=str(args.config), grid_values=dict(cfg)),
        "models": [],
        "rows": [],
        "skipped": [],
        "published": PUBLISHED,
    }
    for name in args.model or cfg["models"]:
        run_model(name, entries, cfg, result, out)
    publish(out, result)
    return 0


def publish(out: Path, result: dict) -> None:
    """results.json, results.md and output_layer.png (with matplotlib) in out; the tables on stdout."""
    from common import plots
    from common.record import say_written, write_json

    write_json(out / "results.json", result)
    (out / "results.md").write_text(report(result))
    drawn = plots.draw({"output_layer.png": lambda: plot(result["rows"], out / "output_layer.png")})
    print(report(result))
    print("", file=sys.stderr)
    say_written(out, ["results.json", "results.md", *drawn])


def run_model(name, entries, cfg, result, out) -> None:
    """Every index setting of the grid on one model, into result (written after each setting)."""
    from vecgpt.errors import VecgptError

    from common.record import write_json
    from output_index import expand

    try:
        model, desc = load_model(name)
    except VecgptError as e:
        print(f"model {name}: skipped ({e})", file=sys.stderr)
        result["skipped"].append({"model": name, "what": "model", "reason": str(e)})
        return
    t = time.perf_counter()
    data = prepare(model, cfg)
    data["top1_frequent"] = float(np.isin(data["g_top"], data["frequent"]).mean())
    result["models"].append(model_info(name, desc, model, data, t))
    print(
        f"model {name}: {len(data['W'])} x {data['W'].shape[1]} token vectors; exact numpy output layer "
        f"{data['numpy_ms']:.2f} ms, body {data['body_ms']:.1f} ms",
        file=sys.stderr,
    )
    for entry in entries:
        for build, searches in expand(entry):
            if measure(entry["kind"], build, searches, name, model, data, cfg, result["rows"], result["skipped"]):
                write_json(out / "results.json", result)  # partial results survive an interrupted grid


def model_info(name, desc, model, data, started) -> dict:
    return {
        "name": name,
        "description": desc,
        "source": model.source,
        "fingerprint": model.fingerprint,
        "hparams": model.hparams.__dict__,
        "output_vectors": len(data["W"]),
        "frequent": len(data["frequent"]),
        "text_positions": len(data["H"]),
        "greedy_positions": len(data["G"]),
        "numpy_ms": data["numpy_ms"],
        "numpy_p10_ms": data["numpy_p10_ms"],
        "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "top1_frequent": data["top1_frequent"],
        "body_ms": data["body_ms"],
        "token_exact_ms": data["whole_exact_ms"],
        "prepare_s": time.perf_counter() - started,
    }


def measure(kind, build, searches, name, model, data, cfg, rows, skipped) -> bool:
    """Build one index setting and add a row per search setting to rows; False (noted in skipped) if it cannot run."""
    from output_index import Unavailable, make

    try:
        index = make(kind, threads=cfg["threads"], **build).build(data["W"])
    except Unavailable as e:
        print(f"  {kind} {build}: skipped ({e})", file=sys.stderr)
        skipped.append({"model": name, "what": f"{kind} {build}", "reason": str(e)})
        return False
    try:
        for search in searches:
            index.set(**search)
            row = {
                "model": name,
                "kind": kind,
                "label": index.label,
                "params": dict(index.params),
                **evaluate(index, data, cfg, model),
            }
            row["params"].pop("dsn", None)
            rows.append(row)
            print(
                f"  {index.label}: recall@10 {row['recall@10']:.3f}, top-1 {row['top1_agreement']:.3f}, "
                f"{row['head_ms']:.2f} ms ({row['speedup']:.1f}x), build {row['build_s']:.1f} s",
                file=sys.stderr,
            )
    finally:
        index.close()
    return True


def merge(folders, out) -> int:
    """One results.json / results.md / plot from several runs (e.g. kinds run in separate processes)."""
    import json

    parts = [json.loads((Path(f) / "results.json").read_text()) for f in folders]
    models = [m for p in parts for m in p["models"]]  # one entry per run: each has its own exact baseline
    result = {
        "provenance": parts[0]["provenance"],
        "merged_from": [str(f) for f in folders],
        "models": models,
        "rows": [r for p in parts for r in p["rows"]],
        "skipped": [s for p in parts for s in p["skipped"]],
        "published": PUBLISHED,
    }
    publish(out, result)
    return 0


def main(argv=None) -> int:
    import common

    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
