"""Where a generated token's time goes on one store: the meter's seconds per request kind (store time),
the rest (engine numpy and Python), and cProfile's top functions.

    python benchmarks/profile_token.py --config configs/faiss.toml [-n 8] [--threads 2] [--top 25]
        [--store connections=1]   (a [store] setting of the config overridden; a TOML value)
        [--layout four|three|five]   (the model's layout; default the config's)
        [--parts]   (also the seconds a token spends in named engine and store functions, PARTS)

Same model and prompt as benchmarks/per_token.py (random weights at GPT-2 small shape); the store is
placed beside the config's (suffix `bench`, as per_token.py does), loaded if it lacks the model.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import io
import pstats
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import pin_threads  # noqa: E402

pin_threads(sys.argv)

import numpy as np  # noqa: E402
from per_token import load_model  # noqa: E402

from vecgpt import tokenizer  # noqa: E402
from vecgpt.config import LAYOUTS, load_config, open_store, tomllib  # noqa: E402
from vecgpt.engine import Engine  # noqa: E402
from vecgpt.loading import push, store_fingerprint  # noqa: E402
from vecgpt.reference import Reference  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
from common.subjects import place  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="configs/faiss.toml")
    parser.add_argument("-n", type=int, default=8, help="generated tokens profiled")
    parser.add_argument("--prompt", default="The history of the vector database begins")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--top", type=int, default=25, help="functions listed, by own time")
    parser.add_argument("--place", default="bench", help="suffix of the store's place beside the config's")
    parser.add_argument("--store", action="append", default=[], metavar="KEY=VALUE", help="a [store] setting")
    parser.add_argument("--layout", choices=LAYOUTS, default=None, help="the model's layout (default: the config's)")
    parser.add_argument("--parts", action="store_true", help="also time named engine and store functions (PARTS)")
    return parser.parse_args(argv)


def timed_tokens(reader, ids, n, profiler=None, started=lambda: None):
    cands, times = reader.read(ids), []
    started()
    for _ in range(n):
        if hasattr(reader, "meter"):
            reader.meter.start_token()
        t = time.perf_counter()
        if profiler:
            profiler.enable()
        cands = reader.read([int(cands.ids[0])])
        if profiler:
            profiler.disable()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def main():
    args = parse_args()
    model, ids = load_model(None), tokenizer.encode(args.prompt)
    config = load_config(args.config, layout=args.layout)
    place(config, args.place)
    config.store.update(tomllib.loads("\n".join(args.store)))
    store = timed(open_store(config))
    push(store, model, config.metric, progress=False, layout=config.layout)
    engine = Engine(
        store,
        top_k=config.top_k,
        prompt_block=config.prompt_block,
        model=store_fingerprint(model, config.metric, config.layout),
    )
    text = engine.open()
    numpy_s, plain_s = interleaved([Reference(model, np.float32), text], ids, args.n, store.seconds.clear)
    by_matrix = {k: v / args.n for k, v in sorted(store.seconds.items())}
    decode = text.meter.summary()["per_token"][1:]
    store_s, requests = mean_seconds(decode), {k: np.mean([t[k] for t in decode]) for k in ("total", "round_trips")}
    text.close()
    text, profiler = engine.open(), cProfile.Profile()
    profiled_s = timed_tokens(text, ids, args.n, profiler)
    text.close()
    report(args, config.layout, numpy_s, plain_s, store_s, by_matrix, profiled_s, profiler, requests)
    if args.parts:
        text = engine.open()
        report_parts(parts(text, ids, args.n))
        text.close()
    store.close()


def timed(store):
    """The store, its searches timed by matrix (matrix()) in store.seconds; a search that calls
    search_many inside is counted once. Calls sent together from several threads (a round's key
    searches and projections) are each timed whole, so they may sum to more than the round."""
    store.seconds, depth, lock = Counter(), threading.local(), threading.Lock()
    for method in ("search", "search_many"):
        inner = getattr(store, method)

        def wrapped(*args, inner=inner, **kw):
            first = args[0] if isinstance(args[0], str) else args[0][0].collection
            depth.n = getattr(depth, "n", 0) + 1
            t = time.perf_counter()
            try:
                return inner(*args, **kw)
            finally:
                depth.n -= 1
                if not depth.n:
                    with lock:
                        store.seconds[matrix(first)] += time.perf_counter() - t

        setattr(store, method, wrapped)
    return store


# Functions whose wall time a token --parts reports, each whole (what it calls included: a layer's search_many
# inside scores_and_projections, say): the pieces the engine and the in-process stores spend a token on,
# without cProfile's cost on every call.
PARTS = [
    (
        "vecgpt.engine",
        "Session",
        "linear scatter search_of weighted_values key_searches key_columns key_round key_rows gpt2".split(),
    ),
    ("vecgpt.engine", None, ["layer_norm", "gelu"]),
    ("vecgpt.backends._in_process", "InProcessStore", ["upsert", "_col"]),  # searches: the meter's line above
    ("vecgpt.backends._in_process", "Collection", ["group_slots"]),
    ("vecgpt.backends.faiss", "FaissTable", ["all_dists_groups", "every_row"]),
    ("vecgpt.backends.faiss", None, ["in_threads"]),
]


def parts(text, ids, n: int) -> dict:
    """Seconds a generated token spends in each of PARTS (a pause before each token, as in interleaved)."""
    seconds, originals = Counter(), []
    cands = text.read(ids)
    for module, cls, names in PARTS:
        owner = importlib.import_module(module)
        owner = getattr(owner, cls) if cls else owner
        for name in names:
            inner = getattr(owner, name)

            def wrapped(*args, inner=inner, label=f"{cls or module}.{name}", **kw):
                t = time.perf_counter()
                try:
                    return inner(*args, **kw)
                finally:
                    seconds[label] += time.perf_counter() - t

            originals.append((owner, name, inner))
            setattr(owner, name, wrapped)
    try:
        for _ in range(n):
            time.sleep(SETTLE_S)
            t = time.perf_counter()
            cands = text.read([int(cands.ids[0])])
            seconds["a whole token"] += time.perf_counter() - t
    finally:
        for owner, name, inner in originals:
            setattr(owner, name, inner)
    return {label: s / n for label, s in seconds.most_common()}


def report_parts(per_token: dict) -> None:
    print("  parts, ms/token (each function whole, with what it calls):")
    for label, s in per_token.items():
        print(f"    {s * 1e3:7.2f}  {label}")


def matrix(collection: str) -> str:
    """<fingerprint>.h.<layer>.mlp.c_fc -> mlp.c_fc; <fingerprint>.wte -> wte; text-<id> -> keys."""
    if collection.startswith("text-"):
        return "keys"
    return ".".join(p for p in collection.split(".")[1:] if p != "h" and not p.isdigit())


# OpenBLAS's idle workers spin for 2^28 cycles (0.13 s at 2.1 GHz) after numpy's last call before they sleep.
# Taken straight after numpy's token, the store's token shared the cores with them: its scans ran 1.5-2x slower
# than alone (docs/notes.md, 2026-12-02). A pause before each token lets them sleep.
SETTLE_S = 0.2


def interleaved(readers, ids, n, started, pause: float = SETTLE_S):
    """Median seconds a token of each reader, their tokens taken in turn (a busy machine slows both alike), each
    after a pause in which the other's idle threads stop spinning (`pause` seconds)."""
    cands, times = [r.read(ids) for r in readers], [[] for _ in readers]
    started()
    for _ in range(n):
        for j, reader in enumerate(readers):
            if hasattr(reader, "meter"):
                reader.meter.start_token()
            time.sleep(pause)
            t = time.perf_counter()
            cands[j] = reader.read([int(cands[j].ids[0])])
            times[j].append(time.perf_counter() - t)
    return [float(np.median(t)) for t in times]


def mean_seconds(tokens) -> dict:
    """The meter's seconds per kind, averaged over the generated tokens (the prompt's read left out)."""
    kinds = sorted({k for t in tokens for k in t["seconds_by_kind"]})
    return {k: float(np.mean([t["seconds_by_kind"].get(k, 0.0) for t in tokens])) for k in kinds}


def report(args, layout, numpy_s, plain_s, store_s, by_matrix, profiled_s, profiler, requests):
    print(
        f"{args.config}, layout {layout}: {plain_s * 1e3:.1f} ms/token (numpy float32 {numpy_s * 1e3:.1f}, "
        f"x{plain_s / numpy_s:.2f}); under cProfile {profiled_s * 1e3:.1f}; "
        f"{requests['total']:.0f} requests, {requests['round_trips']:.0f} round trips a token"
    )
    in_store = sum(store_s.values())
    print(
        "  store calls (meter), ms/token (mean): "
        + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in store_s.items())
        + f"; total {in_store * 1e3:.1f}; engine outside store calls {(plain_s - in_store) * 1e3:.1f}"
    )
    print(
        "  searches by matrix, ms/token (the 12 layers together): "
        + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in by_matrix.items())
    )
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.top)
    print("\n".join(line for line in out.getvalue().splitlines()[: args.top + 12] if line.strip()))


if __name__ == "__main__":
    main()
