"""An approximate key search in numpy's forward pass: an hnswlib HNSW index (inner product) over each head's keys.

Per window, layer and head one index holds the window's keys; the query at position i asks it for its K best keys
among positions before i (a filtered search, as the store's key search filters by position). This is the
experiment's own search beside numpy, not a store's: vecgpt's stores search their keys exactly.
"""

from __future__ import annotations

import numpy as np
from sparse_forward import earlier_only, own_keys, top_k_keep


class HnswTopK:
    """Selector (sparse_forward.forward's keep) keeping each query's own key and the K keys hnswlib returns.

    Tallies, over every query with an earlier key: how many of the exact top K it returned (`found`, of `wanted`)."""

    def __init__(self, k: int, m: int = 16, ef_construction: int = 64, ef: int = 16, seed: int = 0):
        self.k, self.m, self.ef_construction, self.ef, self.seed = k, m, ef_construction, ef, seed
        self.found = self.wanted = self.retries = 0

    @property
    def params(self) -> dict:
        return {
            "library": "hnswlib",
            "space": "ip",
            "M": self.m,
            "ef_construction": self.ef_construction,
            "ef": self.ef,
        }

    def __call__(self, scores, q, key, layer, qpos):
        b, h, m, n = scores.shape
        kept = np.zeros(scores.shape, bool)
        for i in range(b):
            for j in range(h):
                kept[i, j] = self.head(q[i, j], key[i, j], qpos)
        exact = top_k_keep(earlier_only(scores, qpos), self.k)
        self.found += int((kept & exact).sum())
        self.wanted += int(exact.sum())
        return kept | own_keys(qpos, n)

    def head(self, q, key, qpos):  # [m, hd], [n, hd] -> keep [m, n]: the keys the index returns for each query
        import hnswlib

        (m, hd), n = q.shape, len(key)
        index = hnswlib.Index(space="ip", dim=hd)
        index.init_index(max_elements=n, M=self.m, ef_construction=self.ef_construction, random_seed=self.seed)
        index.set_num_threads(1)  # insertion order fixed: the same graph every run
        index.add_items(key.astype(np.float32), np.arange(n))
        kept = np.zeros((m, n), bool)
        q32 = q.astype(np.float32)
        for row, i in enumerate(qpos):
            if i:  # position 0 has no earlier key
                kept[row, self.search(index, q32[row], min(self.k, i), i)] = True
        return kept

    def search(self, index, q, k, before):  # labels of the (at most) k best keys before position `before`
        ef = max(self.ef, k)
        while k > 0:
            index.set_ef(ef)
            try:
                return index.knn_query(q, k=k, filter=lambda label: label < before)[0][0]
            except RuntimeError:  # the filtered search found fewer than k: hnswlib's advice is a larger ef
                self.retries += 1
                if ef < index.get_current_count():
                    ef *= 2
                else:  # the graph reaches fewer than k of them (inner product is no metric): take fewer
                    k -= 1
        return np.zeros(0, np.int64)

    @property
    def recall(self) -> float:
        return self.found / self.wanted if self.wanted else 1.0
