"""The scans of one decode step at GPT-2 small shape: FAISS's kernel on one thread, FAISS's kernel with the
rows split over the threads (what vecgpt's FAISS store does for a big one-query scan), and numpy's sgemv.

    python benchmarks/faiss_scans.py [--threads 2] [--repeat 10] [--out benchmarks/results/faiss_scans.json]

Per layer: c_attn (2,304 rows of 770 floats), the 12 heads' rows of c_proj (768 of 66), c_fc (3,072 of 770)
and mlp.c_proj (768 of 3,074); then wte (50,257 of 770). Random float32 rows, about 500 MB: more than the
caches hold, as in a real token. Each form runs its tokens in a row (the first a warm-up) and reports the
median. Not in turn: after a call numpy's OpenBLAS threads spin for a while (OPENBLAS_THREAD_TIMEOUT,
2^28 cycles by default) and take the second core from whatever runs next; taken in turn, the split scan
measured 36 ms a token here against 26 ms in a row (docs/speed.md, "Round 2: FAISS").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import machine, pin_threads  # noqa: E402

THREADS = pin_threads(sys.argv)

import faiss  # noqa: E402
import numpy as np  # noqa: E402

from vecgpt.backends import faiss as store  # noqa: E402

LAYER = [(2304, 770)] + [(768, 66)] * 12 + [(3072, 770), (768, 3074)]
WTE = (50257, 770)


def scan(rows: np.ndarray, q: np.ndarray, out: np.ndarray, threads: int) -> None:
    store.THREADS[0] = threads
    n, dim = rows.shape

    def part(a, b):
        return lambda: faiss.fvec_inner_products_ny(
            faiss.swig_ptr(out[a:b]), faiss.swig_ptr(q), faiss.swig_ptr(rows[a:b]), dim, b - a
        )

    store.in_threads([part(a, b) for a, b in store.row_chunks(n, dim)])


def forms(threads: int) -> dict:
    return {
        "faiss, one thread": lambda rows, q, out: scan(rows, q, out, 1),
        f"faiss, rows split over {threads} threads": lambda rows, q, out: scan(rows, q, out, threads),
        "numpy sgemv": lambda rows, q, out: np.matmul(rows, q, out=out),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=10, help="tokens timed per form")
    parser.add_argument("--out", default="benchmarks/results/faiss_scans.json")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    shapes = LAYER * 12 + [WTE]
    tables = [rng.standard_normal(shape, np.float32) for shape in shapes]
    queries = [rng.standard_normal(shape[1], np.float32) for shape in shapes]
    outs = [np.empty(shape[0], np.float32) for shape in shapes]
    times = {name: [] for name in forms(args.threads)}
    for name, form in forms(args.threads).items():
        for _ in range(args.repeat + 1):  # the first token warms up, not counted
            start = time.perf_counter()
            for rows, q, out in zip(tables, queries, outs):
                form(rows, q, out)
            times[name].append(time.perf_counter() - start)
    ms = {name: 1e3 * float(np.median(t[1:])) for name, t in times.items()}
    numpy_ms = ms["numpy sgemv"]
    for name, value in ms.items():
        print(f"{name:32s} {value:7.1f} ms a token  x{value / numpy_ms:.2f} numpy")
    record = {"ms_per_token": ms, "x_numpy": {k: v / numpy_ms for k, v in ms.items()}, **machine(args.threads)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
