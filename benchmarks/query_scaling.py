"""Query scaling (vecgpt.encoding): float32 error of c_fc-shaped outputs before and after.

    PYTHONPATH=. python benchmarks/query_scaling.py [--queries 8] [--seed 0]

A GPT-2-like random c_fc (768 -> 3072, normal 0.02 weights and biases, as weights.make_params) and
layer-norm-sized inputs x ~ N(0, 1) (|x| ~ 28), at three input scales. Distances are computed in
float32 three ways: the direct form sum (q_i - d_i)^2 summed pairwise (numpy's np.sum) and
sequentially (np.cumsum, the worst plausible order), and FAISS IndexFlatL2 (|q|^2 + |d|^2 - 2 q.d
through BLAS). Each is decoded with and without the query scaled by s = M/|q| (a power of two), and
compared with float64 x @ w + b. Prints the largest errors, their ratio and the derived bound
(encoding.search_bound); writes benchmarks/results/query_scaling.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from vecgpt import encoding


def direct(q, docs, order):  # [m, dim], [n, dim] float32 -> [m, n] float32 distances
    terms = np.ascontiguousarray(
        (q[:, None, :] - docs[None]) ** 2
    )  # float32; np.sum is pairwise only along contiguous rows
    return terms.sum(-1, dtype=np.float32) if order == "pairwise" else np.cumsum(terms, -1, dtype=np.float32)[..., -1]


def faiss_dists(q, docs):
    import faiss

    index = faiss.IndexFlatL2(docs.shape[1])
    index.add(docs)
    d, i = index.search(q, len(docs))
    out = np.empty_like(d)
    np.put_along_axis(out, i, d, axis=1)
    return out


ORDERS = {
    "numpy pairwise": lambda q, d: direct(q, d, "pairwise"),
    "sequential (cumsum)": lambda q, d: direct(q, d, "seq"),
    "faiss IndexFlatL2": faiss_dists,
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--queries", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    w = (rng.standard_normal((768, 3072)) * 0.02).astype(np.float32)
    b = (rng.standard_normal(3072) * 0.02).astype(np.float32)
    docs, m2 = encoding.encode_rows(w, b, "l2")
    results = []
    for scale in (1.0, 0.1, 10.0):
        x = (rng.standard_normal((args.queries, 768)) * scale).astype(np.float32)
        exact = x.astype(np.float64) @ w.astype(np.float64) + b.astype(np.float64)
        bound = float(encoding.search_bound(x, m2, "l2", encoding.U32).max())
        for name, dists in ORDERS.items():
            row = {
                "x_scale": scale,
                "order": name,
                "M": float(np.sqrt(m2)),
                "q_norm": float(np.linalg.norm(x, axis=1).mean()),
                "bound_scaled": bound,
            }
            for label, q in (
                ("unscaled", encoding.encode_queries(x, "l2")),
                ("scaled", encoding.encode_queries(x, "l2", m2)),
            ):
                y = encoding.decode_dists(dists(q, docs), q, m2, "l2")
                row[f"error_{label}"] = float(np.abs(y - exact).max())
            row["ratio"] = row["error_unscaled"] / row["error_scaled"]
            results.append(row)
            print(
                f"|x|~{row['q_norm']:7.2f} M={row['M']:.3f} {name:20s} unscaled {row['error_unscaled']:.2e} "
                f"scaled {row['error_scaled']:.2e}  x{row['ratio']:5.1f}  (bound {bound:.2e})"
            )
    out = Path(__file__).parent / "results" / "query_scaling.json"
    out.write_text(json.dumps({"seed": args.seed, "queries": args.queries, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
