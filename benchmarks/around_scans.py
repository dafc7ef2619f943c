"""What a token spends around its multiplies: the engine and the FAISS store with FAISS's scan kernels made to do
nothing, against numpy's float32 reference with its `x @ w + b` made zeros plus the bias. What is left in each is
the Python and the small numpy work between the multiplies (layer norm, attention, encoding and decoding, the
store's bookkeeping, the meter): the part of the ratio to numpy that no faster scan can take away.

    python benchmarks/around_scans.py [--config configs/faiss-ip.toml] [-n 100] [--layout five] [--pause 0]
        [--threads 2]

The model is per_token.py's (random weights at GPT-2 small shape), the store beside the config's as there. The
key searches' kernel (FAISS's by-index kernel over a text's keys) still runs: its work is small. --pause sleeps
that long before each token, as the speed table does (0.2 s): both then start each token on cold caches.
Medians of n tokens, the two readers in turn.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import machine, pin_threads  # noqa: E402

pin_threads(sys.argv)

import numpy as np  # noqa: E402
from per_token import load_model  # noqa: E402
from profile_token import interleaved  # noqa: E402

import vecgpt.backends.faiss as faiss_store  # noqa: E402
from vecgpt import reference, tokenizer  # noqa: E402
from vecgpt.config import LAYOUTS, load_config, open_store  # noqa: E402
from vecgpt.engine import Engine  # noqa: E402
from vecgpt.loading import push, store_fingerprint  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
from common.subjects import place  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="configs/faiss-ip.toml", help="a FAISS config")
    parser.add_argument("-n", type=int, default=100, help="generated tokens timed")
    parser.add_argument("--prompt", default="The history of the vector database begins")
    parser.add_argument("--layout", choices=LAYOUTS, default="five")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds idle before each token")
    parser.add_argument("--threads", type=int, default=2)
    return parser.parse_args(argv)


def no_multiplies() -> None:
    """FAISS's scan kernels do nothing (their outputs stay as allocated); numpy's linear returns zeros + bias."""
    faiss_store.ONE_QUERY = dict.fromkeys(faiss_store.ONE_QUERY, lambda *args: None)
    faiss_store.on_openmp = lambda q, rows, numbers, metric: np.zeros(len(rows), np.float32)
    reference.linear = lambda x, weight, bias, perturb=None: np.zeros((len(x), weight.shape[1]), x.dtype) + bias


def main():
    args = parse_args()
    model, ids = load_model(None), tokenizer.encode(args.prompt)
    config = load_config(args.config, layout=args.layout)
    if config.backend != "faiss":
        sys.exit("around_scans: a FAISS config, please (the kernels it stubs are FAISS's)")
    place(config, "bench")
    store = open_store(config)
    push(store, model, config.metric, progress=False, layout=config.layout)
    engine = Engine(store, top_k=config.top_k, model=store_fingerprint(model, config.metric, config.layout))
    readers = {"numpy float32": reference.Reference(model, np.float32), args.config: engine.open()}
    no_multiplies()
    medians = interleaved(list(readers.values()), ids, args.n, lambda: None, pause=args.pause)
    m = machine(args.threads)
    print(
        f"around the multiplies, layout {config.layout}, {args.n} tokens, pause {args.pause} s; {m['cpu']}, "
        f"{m['cores']} cores, {args.threads} threads, {m['blas']}; commit {m['commit'][:12]}, {m['date']}"
    )
    for name, seconds in zip(readers, medians):
        print(f"  {name}: {seconds * 1e3:.2f} ms a token (median)")
    store.close()


if __name__ == "__main__":
    main()
