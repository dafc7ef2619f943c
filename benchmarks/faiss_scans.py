"""The scans of one decode step at GPT-2 small shape: FAISS's kernel on one thread, FAISS's kernels with the rows
split over OpenMP's threads and over the store's workers (what vecgpt's FAISS store does for a big one-query scan,
the one or the other: faiss.Pace), and numpy's sgemv.

    python benchmarks/faiss_scans.py [--threads 2] [--repeat 10] [--pause 0] [--gap-us 0]
                                     [--out benchmarks/results/faiss_scans.json]

Per layer: c_attn (2,304 rows of 770 floats), the 12 heads' rows of c_proj (768 of 66), c_fc (3,072 of 770)
and mlp.c_proj (768 of 3,074); then wte (50,257 of 770). Random float32 rows, about 500 MB: more than the
caches hold, as in a real token. Each form runs its tokens in a row (the first a warm-up) and reports the
median. Not in turn: after a call numpy's OpenBLAS threads spin for a while (OPENBLAS_THREAD_TIMEOUT,
2^28 cycles by default) and take the second core from whatever runs next; taken in turn, the split scan
measured 36 ms a token here against 26 ms in a row (docs/speed.md, "Round 2: FAISS").

A token inside the engine is not that: the engine works between scans and a reader may pause between tokens.
--gap-us spends that long on small numpy work after each scan, --pause sleeps that long before each token. A
further form splits the rows as the store did before b58d6fc, the calling thread scanning one share and an
unpinned worker the other (what each form took, either way: docs/speed.md, "Round 6").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import machine, pin_threads  # noqa: E402

THREADS = pin_threads(sys.argv)

import faiss  # noqa: E402
import numpy as np  # noqa: E402

from vecgpt.backends import faiss as store  # noqa: E402

LAYER = [(2304, 770)] + [(768, 66)] * 12 + [(3072, 770), (768, 3074)]
WTE = (50257, 770)


def shares(rows: np.ndarray, q: np.ndarray, out: np.ndarray, threads: int) -> list:
    """A one-query scan's shares, as the store splits it over `threads`: a call each."""
    store.THREADS[0] = threads
    n, dim = rows.shape

    def part(a, b):
        return lambda: faiss.fvec_inner_products_ny(
            faiss.swig_ptr(out[a:b]), faiss.swig_ptr(q), faiss.swig_ptr(rows[a:b]), dim, b - a
        )

    return [part(a, b) for a, b in store.row_chunks(n, dim)]


def scan(rows: np.ndarray, q: np.ndarray, out: np.ndarray, threads: int) -> None:
    store.in_threads(shares(rows, q, out, threads))


def on_openmp(rows: np.ndarray, q: np.ndarray, out: np.ndarray, threads: int, held: dict) -> None:
    """The store's split while OpenMP's threads keep pace (Pace): FAISS's by-index kernel over `threads` lines."""
    key = (id(rows), threads)
    if key not in held:
        held[key] = store.lines(len(rows), threads)
    out[:] = store.on_openmp(q[None], rows, held[key], "ip")


def caller_shares(rows: np.ndarray, q: np.ndarray, out: np.ndarray, pool: ThreadPoolExecutor, threads: int) -> None:
    """The split before b58d6fc: unpinned workers scan all shares but the last, which the calling thread scans."""
    parts = shares(rows, q, out, threads)
    futures = [pool.submit(part) for part in parts[:-1]]
    parts[-1]()
    for future in futures:
        future.result()


def forms(threads: int) -> dict:
    pool, held = ThreadPoolExecutor(max(1, threads - 1)), {}
    return {
        "faiss, one thread": lambda rows, q, out: scan(rows, q, out, 1),
        f"faiss, rows on {threads} OpenMP threads": lambda rows, q, out: on_openmp(rows, q, out, threads, held),
        f"faiss, rows split over {threads} threads": lambda rows, q, out: scan(rows, q, out, threads),
        "faiss, split, caller scans a share": lambda rows, q, out: caller_shares(rows, q, out, pool, threads),
        "numpy sgemv": lambda rows, q, out: np.matmul(rows, q, out=out),
    }


def engine_work(seconds: float, x: np.ndarray) -> None:
    """About what the engine does between two scans: small numpy calls (a layer norm's), for `seconds`."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        (x - x.mean()) / np.sqrt(x.var() + 1e-5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=10, help="tokens timed per form")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds idle before each token")
    parser.add_argument("--gap-us", type=float, default=0.0, help="microseconds of numpy work after each scan")
    parser.add_argument("--out", default="benchmarks/results/faiss_scans.json")
    args = parser.parse_args()
    x = np.random.default_rng(1).standard_normal(768)
    rng = np.random.default_rng(0)
    shapes = LAYER * 12 + [WTE]
    tables = [rng.standard_normal(shape, np.float32) for shape in shapes]
    queries = [rng.standard_normal(shape[1], np.float32) for shape in shapes]
    outs = [np.empty(shape[0], np.float32) for shape in shapes]
    timed = forms(args.threads)  # once: the old split's form holds a thread pool
    times = {name: [] for name in timed}
    for name, form in timed.items():
        for _ in range(args.repeat + 1):  # the first token warms up, not counted
            time.sleep(args.pause)
            start = time.perf_counter()
            for rows, q, out in zip(tables, queries, outs):
                form(rows, q, out)
                engine_work(args.gap_us * 1e-6, x)
            times[name].append(time.perf_counter() - start - len(tables) * args.gap_us * 1e-6)
    ms = {name: 1e3 * float(np.median(t[1:])) for name, t in times.items()}
    numpy_ms = ms["numpy sgemv"]
    for name, value in ms.items():
        print(f"{name:36s} {value:7.1f} ms a token  x{value / numpy_ms:.2f} numpy")
    print(
        f"(scans only: the {args.gap_us:g} us of work after each is taken out; {args.pause:g} s idle before each token)"
    )
    record = {
        "ms_per_token": ms,
        "x_numpy": {k: v / numpy_ms for k, v in ms.items()},
        "pause_s": args.pause,
        "gap_us": args.gap_us,
        **machine(args.threads),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
