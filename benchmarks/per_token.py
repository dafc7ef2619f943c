"""Per-token time of the engine on each store against the numpy reference, at GPT-2 small shape.

    python benchmarks/per_token.py --configs configs/faiss.toml configs/memory.toml [-n 16] [--threads 2]
        [--layout four|three|five]   (the model's layout on every store; default each config's)

Random weights at the full GPT-2 small shape (12 layers, 12 heads, 768 wide, 1,024 positions,
50,257 tokens), written once under ~/.cache/vecgpt/models. Threads are pinned before numpy loads.
Prints a table and writes benchmarks/results/per_token.json. `benchmarks/speed_table.py` runs this
with turbopuffer in one go and writes README's table; its pieces are these functions.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import machine, pin_threads  # noqa: E402

pin_threads(sys.argv)

import numpy as np  # noqa: E402

from vecgpt import tokenizer, weights  # noqa: E402
from vecgpt.config import LAYOUTS, load_config, open_store  # noqa: E402
from vecgpt.engine import Engine  # noqa: E402
from vecgpt.loading import drop, push, store_fingerprint  # noqa: E402
from vecgpt.reference import Reference  # noqa: E402
from vecgpt.sampling import Candidates  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
from common.subjects import place  # noqa: E402 (the experiments' helpers)


def parse_args(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", nargs="+", default=["configs/faiss.toml", "configs/memory.toml"])
    parser.add_argument("--model", default=None, help="model folder (default: random GPT-2 small shape)")
    parser.add_argument("-n", type=int, default=16, help="generated tokens timed per store")
    parser.add_argument("--prompt", default="The history of the vector database begins")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--fresh", action="store_true", help="empty each store first, so the load time is a real load")
    parser.add_argument("--layout", choices=LAYOUTS, default=None, help="the model's layout (default: each config's)")
    parser.add_argument("--out", default="benchmarks/results/per_token.json")
    return parser.parse_args(argv)


def load_model(name: str | None):
    return weights.load(name or str(weights.random_gpt2_small()))


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


class Transformers:
    """GPT2LMHeadModel with its KV cache, read like a vecgpt Session: read(ids) -> the best next tokens."""

    def __init__(self, folder: str, threads: int):
        import torch
        from transformers import GPT2LMHeadModel

        torch.set_num_threads(threads)
        self.torch, self.model = torch, GPT2LMHeadModel.from_pretrained(folder).eval()
        self.past = None

    def read(self, ids, k: int = 40) -> Candidates:
        with self.torch.inference_mode():
            out = self.model(self.torch.tensor([list(ids)]), past_key_values=self.past, use_cache=True)
        self.past = out.past_key_values
        logits = out.logits[0, -1].double().numpy()
        top = np.argsort(-logits)[:k]
        return Candidates(top, logits[top])


def transformers_row(folder: str, ids, n: int, threads: int) -> dict | None:
    """Hugging Face transformers on the same checkpoint, timed as a store is; None without the [transformers] extra."""
    try:
        reader = Transformers(folder, threads)
    except ImportError:
        return None
    first, tok, _ = per_token_seconds(reader, ids, n)
    return {"store": "transformers (torch, KV cache)", "prompt_s": first, "per_token_s": tok}


def reference_row(model, ids, n) -> dict:
    first, tok, _ = per_token_seconds(Reference(model, np.float32), ids, n)
    return {"store": "numpy reference (float32)", "prompt_s": first, "per_token_s": tok, "ratio": 1.0}


def store_row(model, ids, config, n, fresh: bool, keep: bool = True, layout: str | None = None) -> dict:
    """Load the model into the config's store in `layout` (None: the config's; emptied first if fresh), then time
    n decode tokens there."""
    store, layout = open_store(config), layout or config.layout
    key = store_fingerprint(model, config.metric, layout)
    if fresh:
        drop(store, key)
    t = time.perf_counter()
    push(store, model, config.metric, progress=True, layout=layout)
    load_s = time.perf_counter() - t
    text = Engine(store, top_k=config.top_k, prompt_block=config.prompt_block, model=key).open()
    first, tok, _ = per_token_seconds(text, ids, n)
    row = {"store": f"{config.backend} ({config.metric})", "layout": layout, "prompt_s": first, "per_token_s": tok}
    row["load_s"] = load_s
    row.update(meter_figures(text.meter.summary()), **stored(store.stats()))
    text.close()
    if not keep:
        drop(store, key)
    store.close()
    return row


def meter_figures(summary) -> dict:
    decode = summary["per_token"][1:]
    return {
        "prompt_requests": summary["per_token"][0],
        "requests_per_token": float(np.mean([d["total"] for d in decode])),
        "round_trips_per_token": float(np.mean([d["round_trips"] for d in decode])),
        "by_kind_per_token": decode[-1]["by_kind"],
    }


def stored(stats) -> dict:
    model_rows = [s for name, s in stats.items() if not name.startswith("text-")]
    return {
        "stored_documents": sum(s["documents"] for s in model_rows),
        "stored_bytes": sum(s["bytes"] for s in model_rows),
    }


def main():
    args = parse_args()
    model = load_model(args.model)
    ids = tokenizer.encode(args.prompt)
    rows = [reference_row(model, ids, args.n)]
    for path in args.configs:
        config = load_config(path)
        place(config, "bench")  # a store of its own beside the config's, so the default stores keep their model
        rows.append({**store_row(model, ids, config, args.n, args.fresh, layout=args.layout), "config": path})
        rows[-1]["ratio"] = rows[-1]["per_token_s"] / rows[0]["per_token_s"]
    print_table(rows, args, len(ids))
    write_json(args.out, {"model": model.source, "hparams": model.hparams.__dict__, "threads": args.threads}, rows)


def print_table(rows, args, prompt_tokens):
    m = machine(args.threads)
    print(
        f"\nper generated token, median of {args.n}; prompt of {prompt_tokens} tokens; "
        f"{args.threads} threads; {m['cpu']}, {m['cores']} cores"
    )
    print(
        f"{'store':28} {'layout':6} {'ms/token':>9} {'x numpy':>8} {'prompt ms':>10} {'req/tok':>8} {'rt/tok':>7} {'load s':>7} {'docs':>9} {'MB':>7}"
    )
    for r in rows:
        print(
            f"{r['store']:28} {r.get('layout', ''):6} {r['per_token_s'] * 1e3:9.1f} {r['ratio']:8.2f} {r['prompt_s'] * 1e3:10.1f} "
            f"{r.get('requests_per_token', 0):8.0f} {r.get('round_trips_per_token', 0):7.0f} {r.get('load_s', 0):7.1f} "
            f"{r.get('stored_documents', 0):9,} {r.get('stored_bytes', 0) / 1e6:7.0f}"
        )
    for r in rows[1:]:
        print(f"  {r['store']}: requests per token by kind {r['by_kind_per_token']}")


def write_json(out, head: dict, rows):
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump({**head, "machine": machine(head.get("threads", 0)), "rows": rows}, f, indent=1, default=float)


if __name__ == "__main__":
    main()
