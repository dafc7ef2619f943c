"""The output layer as an approximate maximum-inner-product search (issue 7; Loretz et al. 2026).

GPT-2's last step scores the final vector h = ln_f(x) against all V token vectors (`h @ wte.T`) and
keeps the best few. Here an ANN index over the token vectors returns `k` candidates instead, a short
list of always-scored tokens (special and very frequent ones) is added, and every candidate is
rescored exactly. So:

- `OutputIndex.search(h [m, d], k) -> (ids [m, k] int64, scores [m, k] float64)`: the index's own
  candidates and the scores *as the index reports them* (`exact_scores` says whether those are the
  true inner products up to float32 rounding: True for HNSW/IVF-flat kinds, False for PQ/SQ
  kinds, whose scores come from compressed codes). Missing slots (an index that found fewer than
  k) have id -1 and score -inf.
- `Head.candidates(h)`: what decoding uses. The union of the index's candidates and the frequent
  tokens, each scored exactly as float64(wte[id]) . float64(h), ordered best first like
  `vecgpt.sampling.top_k` (ties to the lowest id). The index's scores only choose candidates.

Inner product is used directly by every kind here (hnswlib space "ip", FAISS METRIC_INNER_PRODUCT,
LanceDB "dot", pgvector `vector_ip_ops`). hnswlib and FAISS HNSW also take `transform = "padded"`:
the padding transform of `vecgpt.encoding` (documents (w, 0, sqrt(M^2 - |w|^2)), queries (h, 1, 0),
squared L2), which turns MIPS into a nearest-neighbour search on vectors of one length.

ANN indexes live in their own collections (a LanceDB table `wte_ann_<type>` in their own folder, a
pgvector table `<schema>."wte.ann.<method>"`, a turbopuffer namespace `<prefix>wte.ann`), never on a store's `wte`, so the exact searches of
every other command cannot use them.

Modules: `base` (OutputIndex and its helpers), `local` (hnswlib, FAISS), `stores` (LanceDB, pgvector,
turbopuffer), `head` (Head, final_hidden, AnnReader). This file registers the kinds: KINDS, make, expand.
"""

from __future__ import annotations

import itertools

from output_index.base import OutputIndex, Unavailable
from output_index.head import AnnReader, Head, final_hidden
from output_index.libraries import FaissHNSW, FaissIVF, FaissIVFPQ, Hnswlib
from output_index.stores import Lance, Pgvector, Turbopuffer

__all__ = [
    "KINDS",
    "AnnReader",
    "FaissHNSW",
    "FaissIVF",
    "FaissIVFPQ",
    "Head",
    "Hnswlib",
    "Lance",
    "OutputIndex",
    "Pgvector",
    "Turbopuffer",
    "Unavailable",
    "expand",
    "final_hidden",
    "make",
]

KINDS = {cls.kind: cls for cls in (Hnswlib, FaissHNSW, FaissIVF, FaissIVFPQ, Lance, Pgvector, Turbopuffer)}


def make(kind: str, threads: int = 2, **params) -> OutputIndex:
    if kind not in KINDS:
        raise ValueError(f"unknown index kind {kind!r}; known: {', '.join(KINDS)}")
    return KINDS[kind](threads=threads, **params)


def expand(entry: dict) -> list[tuple[dict, list[dict]]]:
    """A grid entry (lists mean "each of") as [(build params, [search params, ...]), ...]."""
    kind = entry["kind"]
    searchable = KINDS[kind].search_params if kind in KINDS else ()
    listed = {k: v if isinstance(v, list) else [v] for k, v in entry.items() if k != "kind"}
    build_keys = [k for k in listed if k not in searchable]
    search_keys = [k for k in listed if k in searchable]
    out = []
    for b in itertools.product(*(listed[k] for k in build_keys)):
        searches = [dict(zip(search_keys, s)) for s in itertools.product(*(listed[k] for k in search_keys))]
        out.append((dict(zip(build_keys, b)), searches))
    return out
