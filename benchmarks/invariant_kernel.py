"""The invariant product against the unconstrained one and the per-query kernels, at GPT-2 small's matrices.

    python benchmarks/invariant_kernel.py [--m 1 16 32] [--layers 12] [--rounds 7] [--threads 1] [--clock cpu]

For each matrix shape (inner-product documents: a row per output, the bias as one more column) and each query
count m, the ms a search of every row takes on a table of each store, as the store computes it:

- FAISS (float32): `blas`, the checked product (vecgpt/backends/_product.py); `faiss`, FAISS's own search with BLAS
  from two queries (`invariant = false`; one query: its one-query kernel); `sgemm`, numpy's plain matmul; `scan`,
  the per-query kernels (`kernel = "scan"`: the one-query kernel, by-index blocks for several).
- memory (float64): `blas`, the checked product; `dgemm`, numpy's plain matmul; `gemv`, a query at a time.

`layers` matrices of each shape are searched in turn (as a token reads a layer's after another's: from memory, not
cache); a round times every kernel once over them, rounds interleave the kernels, and a figure is the median over
rounds. With one thread a search is timed on this thread's CPU clock by default, which other processes on a busy
machine do not inflate (they still share its caches and memory). The ratios are blas over the unconstrained kernels. Also the check's time for each shape, once per process.
Writes benchmarks/results/invariant_kernel.json.
"""

from __future__ import annotations

import argparse
import json
import sys
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
    out.write_text(json.dumps(record, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
