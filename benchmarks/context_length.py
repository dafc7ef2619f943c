"""A generated token's time as the text grows: one store against numpy float32 at the same context length.

    python benchmarks/context_length.py [--config configs/faiss.toml] [--contexts 50 200 800] [-n 6] [--threads 2]
                                        [--layout four|three|five] [--out benchmarks/results/context_length]

Random weights at GPT-2 small shape (context 1,024). For each length a random prompt of that many tokens is
read as one block, then n greedy tokens are timed (median), the store's and numpy's in turn. The meter splits
the store's token into time inside store calls and the engine's own (layer norm, GELU, the softmax and the sum
over each head's kept values, encoding). --layout: the model's (default: the config's). Writes <out>.json and <out>.png; the store is placed beside the
config's (suffix `bench`), loaded if it lacks the model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import machine, pin_threads  # noqa: E402

THREADS = pin_threads(sys.argv)

import numpy as np  # noqa: E402
from per_token import load_model  # noqa: E402
from profile_token import interleaved  # noqa: E402

from vecgpt.config import LAYOUTS, load_config, open_store  # noqa: E402
from vecgpt.engine import Engine  # noqa: E402
from vecgpt.loading import push, store_fingerprint  # noqa: E402
from vecgpt.reference import Reference  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
from common.subjects import place  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/faiss.toml")
    parser.add_argument("--contexts", type=int, nargs="+", default=[50, 200, 800])
    parser.add_argument("-n", type=int, default=6, help="generated tokens timed at each length")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layout", choices=LAYOUTS, default=None, help="the model's layout (default: the config's)")
    parser.add_argument("--out", default="benchmarks/results/context_length")
    return parser.parse_args(argv)


def at_length(engine, model, length, n, seed=0) -> dict:
    ids = np.random.default_rng(seed).integers(0, model.hparams.n_vocab, length).tolist()
    text = engine.open()
    numpy_s, store_s = interleaved([Reference(model, np.float32), text], ids, n, lambda: None)
    tokens = text.meter.summary()["per_token"][-n:]
    in_store = float(np.median([t["seconds"] for t in tokens]))
    text.close()
    return {"context": length, "numpy_ms": 1e3 * numpy_s, "store_ms": 1e3 * store_s, "in_store_ms": 1e3 * in_store}


def plot(rows, title, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["context"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(x, [r["store_ms"] for r in rows], "o-", label="store: whole token")
    ax.plot(x, [r["in_store_ms"] for r in rows], "s--", label="store: inside store calls")
    ax.plot(x, [r["numpy_ms"] for r in rows], "^-", label="numpy float32")
    ax.set(xlabel="context (positions)", ylabel="ms a generated token", title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    args = parse_args()
    model, config = load_model(None), load_config(args.config)
    if max(args.contexts) + args.n > model.hparams.n_ctx:
        sys.exit(f"context_length: error: a context plus -n must stay within {model.hparams.n_ctx} positions")
    place(config, "bench")
    store = open_store(config)
    layout = args.layout or config.layout
    push(store, model, config.metric, progress=False, layout=layout)
    key = store_fingerprint(model, config.metric, layout)
    engine = Engine(store, top_k=config.top_k, model=key)
    rows = []
    for length in args.contexts:
        rows.append(at_length(engine, model, length, args.n))
        r = rows[-1]
        print(
            f"context {length:5d}: {r['store_ms']:7.1f} ms a token (in store calls {r['in_store_ms']:.1f}), "
            f"numpy {r['numpy_ms']:.1f}, x{r['store_ms'] / r['numpy_ms']:.2f}",
            flush=True,
        )
    store.close()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"config": args.config, "layout": layout, "rows": rows, **machine(THREADS)}
    out.with_suffix(".json").write_text(json.dumps(record, indent=2))
    plot(rows, f"{config.backend} ({config.metric}), layout {layout}, GPT-2 small shape", out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
