"""The fixed-order kernel against the per-query kernels, the checked product and numpy, at GPT-2 small's matrices.

    python benchmarks/invariant_kernel.py [--m 1 2 4 8 16 32 64] [--layers 12] [--rounds 7] [--threads 1]
                                          [--clock cpu] [--stores faiss memory] [--token]

For each matrix shape (inner-product documents: a row per output, the bias as one more column; wte: a row per token)
and each query count m, the ms a search of every row takes on a table of each store, as the store computes it:

- FAISS (float32): `fixed`, the fixed-order kernel (`kernel = "fixed"`, vecgpt/backends/_kernel.py); `scan`, FAISS's
  one-query kernel (by-index blocks for several; `kernel = "scan"`); `blas`, the checked product
  (vecgpt/backends/_product.py); `sgemm`, numpy's plain product (`sgemv`, x @ q, for one query).
- memory (float64): `fixed`; `gemv`, a query at a time; `blas`; `dgemm` (`dgemv` for one query).

`layers` matrices of each shape are searched in turn (as a token reads a layer's after another's: from memory, not
cache; wte: one); a round times every kernel once over them, rounds interleave the kernels, and a figure is the median
over rounds. With one thread a search is timed on this thread's CPU clock by default, which other processes on a busy
machine do not inflate (they still share its caches and memory). Ratios: each kernel over numpy's product in the same
run, and fixed over scan (gemv). With --token, a token alone on random GPT-2 small weights with each store's kernels
(configs/faiss.toml and configs/memory.toml, one thread, CPU clock). Writes benchmarks/results/invariant_kernel.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import busy_share, machine, pin_threads  # noqa: E402

THREADS = pin_threads(sys.argv, default=1)

import numpy as np  # noqa: E402

from vecgpt.backends import _product  # noqa: E402
from vecgpt.backends import faiss as vfaiss  # noqa: E402
from vecgpt.backends import memory as vmemory  # noqa: E402

CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}
PER_QUERY = {"faiss": "scan", "memory": "gemv"}
SHAPES = {  # rows (outputs) x dim (inputs and the bias, vecgpt.encoding.doc_dim for ip), GPT-2 small
    "c_attn": (2304, 769),
    "c_fc": (3072, 769),
    "mlp.c_proj": (768, 3073),
    "wte": (50257, 769),  # the token search: one matrix a token
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64], help="query counts")
    p.add_argument("--layers", type=int, default=12, help="matrices of each shape (wte: one), searched in turn")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=1, help="BLAS/OpenMP threads (pinned before numpy loads)")
    p.add_argument("--stores", nargs="+", default=["faiss", "memory"], choices=["faiss", "memory"])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument(
        "--clock",
        choices=CLOCKS,
        default=None,
        help="cpu: this thread's CPU time, which other processes on the machine do not inflate (one thread only); "
        "wall: elapsed time (default: cpu with one thread, else wall)",
    )
    p.add_argument(
        "--token", action="store_true", help="also a token alone with each kernel (one thread; loads a model)"
    )
    p.add_argument("--out", default="benchmarks/results/invariant_kernel.json")
    return p.parse_args(argv)


def faiss_kernels(threads: int) -> dict:
    def run(kernel: str):
        settings = vfaiss.Settings(kernel, True, threads)

        def call(table, q):
            table.settings = settings
            table.all_dists(q, None)

        return call

    def numpy(table, q):
        return table._view() @ q[0] if len(q) == 1 else q @ table._view().T

    return {"fixed": run("fixed"), "scan": run("scan"), "blas": run("blas"), "sgemm": numpy}


def memory_kernels(threads: int) -> dict:
    def run(kernel: str):
        def call(table, q):
            table.kernel = kernel
            table.all_dists(q, None)

        return call

    def numpy(table, q):
        x = table._data[: table.n]
        return x @ q[0] if len(q) == 1 else q @ x.T

    return {"fixed": run("fixed"), "gemv": run("gemv"), "blas": run("blas"), "dgemm": numpy}


KERNELS = {"faiss": faiss_kernels, "memory": memory_kernels}


def timed(kernels: dict, tables: list, q: np.ndarray, rounds: int, clock) -> dict:
    """Median ms a search of one table, per kernel, the kernels interleaved round by round."""
    times = {name: [] for name in kernels}
    for _ in range(rounds + 1):  # the first round warms up, untimed
        for name, call in kernels.items():
            start = clock()
            for table in tables:
                call(table, q)
            times[name].append((clock() - start) / len(tables))
    return {name: 1e3 * float(np.median(t[1:])) for name, t in times.items()}


def tables_of(store: str, rows: int, dim: int, layers: int, rng) -> list:
    out = []
    for _ in range(layers):
        x = (rng.standard_normal((rows, dim)) * 0.02).astype(np.float32)
        table = vfaiss.FaissTable(dim, "ip") if store == "faiss" else vmemory.NumpyTable(dim, "ip")
        table.append(x)
        out.append(table)
    return out


def measure(args) -> list[dict]:
    rng, rows_out = np.random.default_rng(0), []
    for store in args.stores:
        kernels, numpy = KERNELS[store](args.threads), "sgemm" if store == "faiss" else "dgemm"
        for name in args.shapes:
            rows, dim = SHAPES[name]
            tables = tables_of(store, rows, dim, 1 if name == "wte" else args.layers, rng)
            for m in args.m:
                q = rng.standard_normal((m, dim)).astype(np.float32 if store == "faiss" else np.float64)
                ms = timed(kernels, tables, q, args.rounds, CLOCKS[args.clock])
                row = {"store": store, "matrix": name, "rows": rows, "dim": dim, "m": m, "ms": ms}
                row["over_numpy"] = {k: ms[k] / ms[numpy] for k in ms if k != numpy}
                row["fixed_over_per_query"] = ms["fixed"] / ms[PER_QUERY[store]]
                kernels["blas"](tables[0], q)
                row["blas_ran"] = tables[0].ran  # blas where the shape's check passed
                rows_out.append(row)
                print(line(row), flush=True)
    return rows_out


def token_ms(backend: str, tokens: int = 12) -> dict:
    """CPU ms of a token alone (median of `tokens` greedy tokens after a ten-token prompt) with each kernel, on random
    weights at GPT-2 small shape loaded into a fresh store of configs/<backend>.toml per kernel."""
    from vecgpt import tokenizer, weights
    from vecgpt.config import load_config, open_store
    from vecgpt.engine import Engine
    from vecgpt.loading import push, store_fingerprint

    config, model, out = load_config(f"configs/{backend}.toml"), weights.load(str(weights.random_gpt2_small())), {}
    ids = tokenizer.encode("The history of the vector database begins in the nineteen")
    for kernel in (PER_QUERY[backend], "fixed"):
        path = tempfile.mkdtemp(prefix="vecgpt-invariant-kernel-")
        store = open_store(replace(config, store={**config.store, "path": path, "kernel": kernel}))
        key = store_fingerprint(model, config.metric, config.layout)
        push(store, model, config.metric, progress=False, layout=config.layout)
        text = Engine(store, top_k=config.top_k, prompt_block=config.prompt_block, model=key).open()
        best, times = text.read(ids), []
        for _ in range(tokens):
            start = time.thread_time()
            best = text.read([int(best.ids[0])])
            times.append(time.thread_time() - start)
        text.close()
        store.close()
        shutil.rmtree(path, ignore_errors=True)
        out[kernel] = 1e3 * float(np.median(times))
    print(f"{backend} ({config.metric}) a token alone, CPU ms: " + "  ".join(f"{k} {v:.1f}" for k, v in out.items()))
    return out


def line(row: dict) -> str:
    ms = "  ".join(f"{k} {v:7.3f}" for k, v in row["ms"].items())
    over = "  ".join(f"{k} {v:4.2f}x" for k, v in row["over_numpy"].items())
    per = PER_QUERY[row["store"]]
    return (
        f"{row['store']:6} {row['matrix']:10} m={row['m']:<3} ms: {ms}   over numpy: {over}   "
        f"fixed/{per} {row['fixed_over_per_query']:4.2f}x   (blas ran {row['blas_ran']})"
    )


def main() -> None:
    args = parse_args()
    args.clock = args.clock or ("cpu" if args.threads == 1 else "wall")
    if args.clock == "cpu" and args.threads != 1:
        raise SystemExit("--clock cpu counts this thread's time only: use it with --threads 1")
    busy = busy_share()
    print(f"machine busy before: {busy:.0%} of its CPU" if busy is not None else "machine load unknown")
    rows = measure(args)
    print("checks:", _product.summary())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"machine": machine(THREADS), "busy_before": busy, "args": vars(args), "rows": rows}
    if args.token:
        if args.threads != 1:
            raise SystemExit("--token times on the CPU clock: use it with --threads 1")
        record["token_alone_ms"] = {backend: token_ms(backend) for backend in args.stores}
    out.write_text(json.dumps(record, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
