"""Per-token time of the engine on each store against the numpy reference, at GPT-2 small shape.

    python benchmarks/per_token.py --configs configs/faiss.toml configs/memory.toml [-n 16] [--threads 2]

Random weights at the full GPT-2 small shape (12 layers, 12 heads, 768 wide, 1,024 positions,
50,257 tokens), written once under ~/.cache/vecgpt/models. Threads are pinned before numpy loads.
Prints a table and writes benchmarks/results/per_token.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--configs", nargs="+", default=["configs/faiss.toml", "configs/memory.toml"])
parser.add_argument("--model", default=None, help="model folder (default: random GPT-2 small shape)")
parser.add_argument("-n", type=int, default=16, help="generated tokens timed per store")
parser.add_argument("--prompt", default="The history of the vector database begins")
parser.add_argument("--threads", type=int, default=2)
parser.add_argument("--fresh", action="store_true", help="empty each store first, so the load time is a real load")
parser.add_argument("--out", default="benchmarks/results/per_token.json")
args = parser.parse_args()
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(args.threads)

import numpy as np  # noqa: E402

from vecgpt import tokenizer, weights  # noqa: E402
from vecgpt.config import load_config, open_store  # noqa: E402
from vecgpt.engine import Engine  # noqa: E402
from vecgpt.loading import (  # noqa: E402
    drop,
    push,  # noqa: E402
    store_fingerprint,
)
from vecgpt.reference import Reference  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
from common.subjects import place  # noqa: E402 (the experiments' helpers)


def model_dir() -> str:
    return args.model or str(weights.random_gpt2_small())


def per_token_seconds(reader, ids, n):
    times, start = [], time.perf_counter()
    cands = reader.read(ids)
    first = time.perf_counter() - start
    for _ in range(n):
        if hasattr(reader, "meter"):
            reader.meter.start_token()
        t = time.perf_counter()
        cands = reader.read([int(cands.ids[0])])
        times.append(time.perf_counter() - t)
    return first, float(np.median(times)), times


def main():
    model = weights.load(model_dir())
    ids = tokenizer.encode(args.prompt)
    first, ref_tok, _ = per_token_seconds(Reference(model, np.float32), ids, args.n)
    rows = [{"store": "numpy reference (float32)", "prompt_s": first, "per_token_s": ref_tok, "ratio": 1.0}]
    for path in args.configs:
        config = load_config(path)
        place(config, "bench")  # a store of its own beside the config's, so the default stores keep their model
        store = open_store(config)
        key = store_fingerprint(model, config.metric)
        if args.fresh:
            drop(store, key)
        t = time.perf_counter()
        push(store, model, config.metric, progress=True)
        load_s = time.perf_counter() - t
        text = Engine(store, top_k=config.top_k, prompt_block=config.prompt_block, tile=config.tile, model=key).open()
        first, tok, _ = per_token_seconds(text, ids, args.n)
        summary = text.meter.summary()
        decode = summary["per_token"][1:]
        stats = store.stats()
        rows.append(
            {
                "store": f"{config.backend} ({config.metric})",
                "config": path,
                "prompt_s": first,
                "per_token_s": tok,
                "ratio": tok / ref_tok,
                "load_s": load_s,
                "stored_documents": sum(s["documents"] for n, s in stats.items() if not n.startswith("text-")),
                "stored_bytes": sum(s["bytes"] for n, s in stats.items() if not n.startswith("text-")),
                "prompt_requests": summary["per_token"][0],
                "requests_per_token": np.mean([d["total"] for d in decode]),
                "round_trips_per_token": np.mean([d["round_trips"] for d in decode]),
                "by_kind_per_token": decode[-1]["by_kind"],
            }
        )
        text.close()
        store.close()
    report(rows, model)


def report(rows, model):
    print(
        f"\nper generated token, median of {args.n}; prompt of {len(tokenizer.encode(args.prompt))} tokens; "
        f"{args.threads} threads; {platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    )
    print(
        f"{'store':28} {'ms/token':>9} {'x numpy':>8} {'prompt ms':>10} {'req/tok':>8} {'rt/tok':>7} {'load s':>7} {'docs':>9} {'MB':>7}"
    )
    for r in rows:
        print(
            f"{r['store']:28} {r['per_token_s'] * 1e3:9.1f} {r['ratio']:8.2f} {r['prompt_s'] * 1e3:10.1f} "
            f"{r.get('requests_per_token', 0):8.0f} {r.get('round_trips_per_token', 0):7.0f} {r.get('load_s', 0):7.1f} "
            f"{r.get('stored_documents', 0):9,} {r.get('stored_bytes', 0) / 1e6:7.0f}"
        )
    for r in rows[1:]:
        print(f"  {r['store']}: requests per token by kind {r['by_kind_per_token']}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(
            {
                "model": model.source,
                "hparams": model.hparams.__dict__,
                "threads": args.threads,
                "machine": {
                    "cpu": platform.processor() or platform.machine(),
                    "cores": os.cpu_count(),
                    "python": platform.python_version(),
                    "numpy": np.__version__,
                },
                "rows": rows,
            },
            f,
            indent=1,
            default=float,
        )


if __name__ == "__main__":
    main()
