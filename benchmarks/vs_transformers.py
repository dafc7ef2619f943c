"""A store's token against Hugging Face transformers' (torch, KV cache) and numpy's, one thread each, in turn.

    python benchmarks/vs_transformers.py [--config configs/faiss.toml] [-n 16] [--rounds 5] [--model DIR]
                                         [--threads 1]

Random weights at GPT-2 small shape unless --model (a GPT-2 folder in Hugging Face's format). Each reads the same
ten-token prompt, then n greedy tokens. A round times n tokens of each, one after another (the store, transformers,
numpy float32), so a slow stretch of the machine slows all three; each round's ratios are taken within it and the
figures are the medians over rounds (after one untimed round of 4 tokens). Needs `pip install -e '.[transformers]'`. The store is loaded fresh into a
temporary folder (a config with a `path`). Writes benchmarks/results/vs_transformers.json.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import pin_threads  # noqa: E402

THREADS = pin_threads(sys.argv, default=1)

import numpy as np  # noqa: E402
import per_token  # noqa: E402

from vecgpt import tokenizer, weights  # noqa: E402
from vecgpt.api import open_engine  # noqa: E402
from vecgpt.config import load_config  # noqa: E402
from vecgpt.reference import Reference  # noqa: E402

PROMPT = "The history of the vector database begins in the nineteen"  # ten GPT-2 tokens


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/faiss.toml")
    parser.add_argument("--model", default=None, help="model folder (default: random GPT-2 small shape)")
    parser.add_argument("-n", type=int, default=16, help="generated tokens timed a round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="BLAS/OpenMP/torch threads (pinned before loading)")
    parser.add_argument("--out", default="benchmarks/results/vs_transformers.json")
    return parser.parse_args(argv)


def one_round(readers: dict, ids, n: int) -> dict:
    """Each reader's median seconds a token over n greedy tokens after the prompt, one reader after another."""
    return {name: per_token.per_token_seconds(make(), ids, n)[1] for name, make in readers.items()}


def main() -> None:
    args = parse_args()
    folder = args.model or str(weights.random_gpt2_small())
    model, ids = weights.load(folder), tokenizer.encode(PROMPT)
    config = load_config(args.config)
    root = tempfile.mkdtemp(prefix="vecgpt-vs-transformers-")
    per_token.place(config, "vs_transformers", root)
    try:
        started = time.perf_counter()
        engine = open_engine(config, model, progress=True)
        load_s = time.perf_counter() - started
        readers = {
            "store": engine.open,
            "transformers": lambda: per_token.Transformers(folder, args.threads),
            "numpy": lambda: Reference(model, np.float32),
        }
        one_round(readers, ids, 4)  # untimed: each reader's first pages of memory, torch's first calls
        rounds = [one_round(readers, ids, args.n) for _ in range(args.rounds)]
        engine.store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report(args, config, rounds, load_s)


def report(args, config, rounds: list[dict], load_s: float) -> None:
    ms = {name: 1e3 * float(np.median([r[name] for r in rounds])) for name in rounds[0]}
    ratio = float(np.median([r["store"] / r["transformers"] for r in rounds]))
    vs_numpy = float(np.median([r["store"] / r["numpy"] for r in rounds]))
    what = f"{config.backend} ({config.metric}, layout {config.layout})"
    print(
        f"\n{Path(args.model or 'GPT-2 small shape, random weights').name}, {args.threads} thread(s) each, {args.rounds} rounds of {args.n} tokens, in turn:\n"
        f"  {what}: {ms['store']:.1f} ms a token\n"
        f"  transformers (torch, KV cache): {ms['transformers']:.1f} ms\n"
        f"  numpy float32: {ms['numpy']:.1f} ms\n"
        f"  store / transformers: {ratio:.2f}x (each round: "
        + ", ".join(f"{r['store'] / r['transformers']:.2f}" for r in rounds)
        + f"); store / numpy: {vs_numpy:.2f}x"
    )
    per_token.write_json(
        args.out,
        {"config": args.config, "store": what, "threads": args.threads, "n": args.n, "load_s": load_s},
        [{"ms_per_token": ms, "store_over_transformers": ratio, "store_over_numpy": vs_numpy, "rounds": rounds}],
    )


if __name__ == "__main__":
    main()
