"""Per-token time on LanceDB over a long generation: do the attention keys' table versions pile up?

    python benchmarks/lancedb_keys.py [-n 200] [--compact-every 12 0] [--never-n 60]

A small random GPT-2 with GPT-2 small's layout of keys (12 layers x 12 heads: 12 key writes and
144 filtered key searches per token) but narrow matrices, so the keys' table is what changes
with the step. One run per `compact_every` setting (0: never compact, for --never-n tokens). Writes
benchmarks/results/lancedb_keys.json and .png (per-token time, key-search time and the keys'
table fragments against the step).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

parser = argparse.ArgumentParser()
parser.add_argument("-n", type=int, default=200, help="generated tokens")
parser.add_argument("--compact-every", type=int, nargs="+", default=[12, 0])
parser.add_argument("--never-n", type=int, default=60, help="generated tokens for compact_every 0 (it gets slow)")
parser.add_argument("--embd", type=int, default=192, help="model width (12 heads)")
parser.add_argument("--threads", type=int, default=2)
parser.add_argument("--out", default="benchmarks/results/lancedb_keys")
args = parser.parse_args()
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(args.threads)

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from vecgpt import weights  # noqa: E402
from vecgpt.backends.base import get_store  # noqa: E402
from vecgpt.engine import Engine  # noqa: E402
from vecgpt.loading import push  # noqa: E402

HP = weights.HParams(n_layer=12, n_head=12, n_embd=args.embd, n_ctx=args.n + 16, n_vocab=2048)
PROMPT = list(range(8))


def run(model, compact_every: int, folder: str) -> dict:
    store = get_store("lancedb", path=folder, compact_every=compact_every)
    push(store, model, "l2", progress=False)
    text = Engine(store).open()
    cands = text.read(PROMPT)
    rows = []
    for step in range(args.n if compact_every else min(args.n, args.never_n)):
        text.meter.start_token()
        t = time.perf_counter()
        cands = text.read([int(cands.ids[0])])
        seconds = time.perf_counter() - t
        s = store.stats()[text.name]
        by_kind = text.meter.current["seconds"]
        rows.append(
            {
                "step": step,
                "seconds": seconds,
                "key_search_s": by_kind["key_search"],
                "matrix_s": by_kind["matrix"],
                "fragments": s["fragments"],
                "version": s["version"],
                "keys": s["documents"],
            }
        )
    text.close()
    store.close()
    return {"compact_every": compact_every, "steps": rows}


def summary(run_: dict) -> str:
    s = run_["steps"]
    first, last = s[:20], s[-20:]
    ms = lambda rows, key: 1e3 * float(np.median([r[key] for r in rows]))  # noqa: E731
    return (
        f"compact_every={run_['compact_every']:3}: per token {ms(first, 'seconds'):7.1f} ms (steps 0-19) -> "
        f"{ms(last, 'seconds'):7.1f} ms (last 20); key searches {ms(first, 'key_search_s'):6.1f} -> "
        f"{ms(last, 'key_search_s'):6.1f} ms; fragments at the end {s[-1]['fragments']}, version {s[-1]['version']}"
    )


def plot(runs: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in runs:
        steps = [s["step"] for s in r["steps"]]
        label = f"compact every {r['compact_every']} writes" if r["compact_every"] else "never compacted"
        a.plot(steps, [1e3 * s["seconds"] for s in r["steps"]], lw=0.8, label=f"{label}: whole token")
        a.plot(steps, [1e3 * s["key_search_s"] for s in r["steps"]], lw=0.8, ls="--", label=f"{label}: key searches")
        b.plot(steps, [s["fragments"] for s in r["steps"]], label=label)
    a.set(
        xlabel="generated token", ylabel="ms", title=f"LanceDB per-token time, 12 layers x 12 heads, width {args.embd}"
    )
    a.set_ylim(bottom=0)
    a.legend(fontsize=8)
    b.set(xlabel="generated token", ylabel="fragments", title="fragments of the keys' table")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        model = weights.load(str(weights.make_model(os.path.join(tmp, "model"), HP, seed=0)))
        runs = [run(model, c, os.path.join(tmp, f"store-{c}")) for c in args.compact_every]
    for r in runs:
        print(summary(r))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump({"hparams": HP.__dict__, "threads": args.threads, "cores": os.cpu_count(), "runs": runs}, f, indent=1)
    plot(runs, args.out + ".png")
    print(f"wrote {args.out}.json and {args.out}.png")


if __name__ == "__main__":
    main()
