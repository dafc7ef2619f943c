"""The shipped model through a store that sums distances in float32, plain sequential order (the
worst plausible), with and without query scaling: the largest logit error against float64 numpy,
teacher-forced, beside the derived tolerance (vecgpt.tolerance).

    PYTHONPATH=. python benchmarks/float32_sequential.py

The store is the memory store with its distance function replaced (this script only).
"""

from __future__ import annotations

import tempfile

import numpy as np

from vecgpt import encoding, tokenizer, tolerance, weights
from vecgpt.api import generate
from vecgpt.backends import memory
from vecgpt.backends.base import get_store
from vecgpt.engine import Engine
from vecgpt.loading import push
from vecgpt.reference import Reference

PROMPTS = ["ROMEO:", "To be, or not"]


def sequential32(self, queries, slots):
    data = self._data if slots is None else self._data[slots]
    q, d = queries.astype(np.float32), data.astype(np.float32)
    chosen = np.broadcast_to(np.arange(self.n) if slots is None else slots, (len(q), len(d)))
    terms = [(row[None] - d) ** 2 if self.metric == "l2" else -(row[None] * d) for row in q]
    return np.stack([np.cumsum(t, -1, dtype=np.float32)[:, -1] for t in terms]).astype(np.float64), chosen


def unscaled():
    plain_q, plain_k = encoding.encode_queries, encoding.key_queries
    encoding.encode_queries = lambda x, metric, m2=None: plain_q(x, metric)
    encoding.key_queries = lambda q, norms2, metric: plain_k(q, norms2[..., :0], metric)


def run(label, model, model64, metric, folder):
    store = get_store("memory", path=folder)
    push(store, model, metric, progress=False)
    engine = Engine(store)
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        tokens = generate(Reference(model64, np.float64), ids, 16, stop=False).tokens
        r = tolerance.forced_comparison(engine.open(), model64, ids, tokens, metric, tolerance.U32)
        print(
            f"{label:10s} {metric} {prompt!r:16s} max error {r['max_error'].max():.2e}  "
            f"tolerance {r['tol'].min():.2e}..{r['tol'].max():.2e}  rule broken {len(r['violations'])}"
        )


def main() -> None:
    for cls in vars(memory).values():
        if isinstance(cls, type) and hasattr(cls, "all_dists"):
            cls.all_dists = sequential32
    model, model64 = weights.load(None), weights.load(None, dtype=np.float64)
    with tempfile.TemporaryDirectory() as tmp:
        for metric in ("l2", "ip"):
            run("scaled", model, model64, metric, f"{tmp}/{metric}")
        unscaled()
        run("unscaled", model, model64, "l2", f"{tmp}/unscaled")


if __name__ == "__main__":
    main()
