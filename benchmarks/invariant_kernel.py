"""The invariant product against the unconstrained one and the per-query kernels, at GPT-2 small's matrices.

    python benchmarks/invariant_kernel.py [--m 1 16 32] [--layers 12] [--rounds 7] [--threads 1] [--clock cpu]
                                          [--token]

For each matrix shape (inner-product documents: a row per output, the bias as one more column) and each query
count m, the ms a search of every row takes on a table of each store, as the store computes it:

- FAISS (float32): `blas`, the checked product (vecgpt/backends/_product.py); `faiss`, FAISS's own search with BLAS
  from two queries (`invariant = false`; one query: its one-query kernel); `sgemm`, numpy's plain matmul; `scan`,
  the per-query kernels (`kernel = "scan"`: the one-query kernel, by-index blocks for several).
- memory (float64): `blas`, the checked product; `dgemm`, numpy's plain matmul; `gemv`, a query at a time.

`layers` matrices of each shape are searched in turn (as a token reads a layer's after another's: from memory, not
cache); a round times every kernel once over them, rounds interleave the kernels, and a figure is the median over
rounds. With one thread a search is timed on this thread's CPU clock by default, which other processes on a busy
machine do not inflate (they still share its caches and memory). The ratios are blas over the unconstrained
kernels. Also each shape's check, once per process, and with --token a token alone on random GPT-2 small weights
with each kernel (configs/faiss.toml and configs/memory.toml, one thread, CPU clock).
Writes benchmarks/results/invariant_kernel.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import busy_share, machine, pin_threads  # noqa: E402

THREADS = pin_threads(sys.argv, default=1)

import faiss  # noqa: E402
import numpy as np  # noqa: E402

from vecgpt.backends import _product  # noqa: E402
from vecgpt.backends import faiss as vfaiss  # noqa: E402
from vecgpt.backends import memory as vmemory  # noqa: E402

CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}
FALLBACK = {"faiss": "scan", "memory": "gemv"}
SHAPES = {  # rows (outputs) x dim (inputs and the bias), GPT-2 small; wte's token search is left out
    "c_attn": (2304, 769),
    "attn.c_proj": (768, 769),
    "c_fc": (3072, 769),
    "mlp.c_proj": (768, 3073),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, nargs="+", default=[1, 16, 32], help="query counts")
    p.add_argument("--layers", type=int, default=12, help="matrices of each shape, searched in turn")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=1, help="BLAS/OpenMP threads (pinned before numpy loads)")
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


def faiss_kernels(tables) -> dict:
    def run(kernel: str, invariant: bool = True):
        def call(table, q):
            vfaiss.KERNEL[0], vfaiss.INVARIANT[0] = kernel, invariant
            faiss.cvar.distance_compute_blas_threshold = vfaiss.BLAS_FROM[invariant]
            table.all_dists(q, None)

        return call

    return {
        "blas": run("blas"),
        "faiss": run("scan", invariant=False),
        "sgemm": lambda table, q: q @ table._view().T,
        "scan": run("scan"),
    }


def memory_kernels() -> dict:
    def run(kernel: str):
        def call(table, q):
            vmemory.KERNEL[0] = kernel
            table.all_dists(q, None)

        return call

    return {"blas": run("blas"), "dgemm": lambda table, q: q @ table._data[: table.n].T, "gemv": run("gemv")}


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


def checked(tables: list, x) -> float:
    """Seconds the check took for this shape (run here, before any timing)."""
    _product.VERDICTS.pop((x.dtype.str, *x.shape), None)
    start = time.perf_counter()
    _product.holds(x)
    return time.perf_counter() - start


def measure(args) -> list[dict]:
    rng, rows_out = np.random.default_rng(0), []
    for store, kernels, unconstrained in (
        ("faiss", faiss_kernels, ("faiss", "sgemm")),
        ("memory", lambda _: memory_kernels(), ("dgemm",)),
    ):
        for name, (rows, dim) in SHAPES.items():
            tables = tables_of(store, rows, dim, args.layers, rng)
            first = tables[0]._view() if store == "faiss" else tables[0]._data[: tables[0].n]
            check_s = checked(tables, first)
            for m in args.m:
                q = rng.standard_normal((m, dim)).astype(np.float32 if store == "faiss" else np.float64)
                ms = timed(kernels(tables), tables, q, args.rounds, CLOCKS[args.clock])
                row = {"store": store, "matrix": name, "rows": rows, "dim": dim, "m": m, "ms": ms}
                row["blas_over"] = {u: ms["blas"] / ms[u] for u in unconstrained}
                kernels(tables)["blas"](tables[0], q)  # which kernel the store's default ran: blas where checked
                row["kernel_ran"], row["check_s"] = tables[0].ran, check_s
                rows_out.append(row)
                print(line(row), flush=True)
    return rows_out


def token_ms(backend: str, tokens: int = 12) -> dict:
    """CPU ms of a token alone (median of `tokens` greedy tokens after a ten-token prompt) with each kernel, twice in
    turn, on random weights at GPT-2 small shape loaded into a fresh store of configs/<backend>.toml."""
    from vecgpt import tokenizer, weights
    from vecgpt.config import load_config, open_store
    from vecgpt.engine import Engine
    from vecgpt.loading import push, store_fingerprint

    config, module = load_config(f"configs/{backend}.toml"), {"faiss": vfaiss, "memory": vmemory}[backend]
    config.store["path"] = tempfile.mkdtemp(prefix="vecgpt-invariant-kernel-")
    model, store = weights.load(str(weights.random_gpt2_small())), open_store(config)
    key = store_fingerprint(model, config.metric, config.layout)
    push(store, model, config.metric, progress=False, layout=config.layout)
    ids, out = tokenizer.encode("The history of the vector database begins in the nineteen"), {}
    for kernel in (FALLBACK[backend], "blas") * 2:
        module.KERNEL[0] = kernel
        text = Engine(store, top_k=config.top_k, prompt_block=config.prompt_block, tile=config.tile, model=key).open()
        best, times = text.read(ids), []
        for _ in range(tokens):
            start = time.thread_time()
            best = text.read([int(best.ids[0])])
            times.append(time.thread_time() - start)
        text.close()
        out.setdefault(kernel, []).append(1e3 * float(np.median(times)))
    store.close()
    shutil.rmtree(config.store["path"], ignore_errors=True)
    print(f"{backend} ({config.metric}) a token alone, CPU ms: " + "  ".join(f"{k} {v}" for k, v in out.items()))
    return out


def line(row: dict) -> str:
    ms = "  ".join(f"{k} {v:7.3f}" for k, v in row["ms"].items())
    over = "  ".join(f"blas/{k} {v:4.2f}x" for k, v in row["blas_over"].items())
    return f"{row['store']:6} {row['matrix']:11} m={row['m']:<3} ms: {ms}   {over}   (ran {row['kernel_ran']})"


def main() -> None:
    args = parse_args()
    args.clock = args.clock or ("cpu" if args.threads == 1 else "wall")
    if args.clock == "cpu" and args.threads != 1:
        raise SystemExit("--clock cpu counts this thread's time only: use it with --threads 1")
    busy = busy_share()
    print(f"machine busy before: {busy:.0%} of its CPU" if busy is not None else "machine load unknown")
    rows = measure(args)
    print("checks:", _product.summary())
    print(
        "check seconds:",
        {f"{r['store']} {r['matrix']}": round(r["check_s"], 3) for r in rows if r["m"] == rows[0]["m"]},
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"machine": machine(THREADS), "busy_before": busy, "args": vars(args), "rows": rows}
    if args.token:
        if args.threads != 1:
            raise SystemExit("--token times on the CPU clock: use it with --threads 1")
        record["token_alone_ms"] = {backend: token_ms(backend) for backend in ("faiss", "memory")}
    out.write_text(json.dumps(record, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
