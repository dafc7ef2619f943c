"""In-process indexes: hnswlib HNSW and FAISS HNSW / IVF-flat / IVF-PQ, inner product or padded L2."""

from __future__ import annotations

import os
import tempfile

import numpy as np

from vecgpt import encoding

from output_index.base import OutputIndex, Unavailable, as_queries, padded


class Hnswlib(OutputIndex):
    """hnswlib HNSW, the paper's index (M=32, ef 100-400; it builds with ef_construction 5000)."""

    kind = "hnswlib"
    search_params = ("ef",)
    defaults = {"M": 32, "ef_construction": 200, "ef": 200, "transform": "ip"}

    def _build(self, vectors):
        import hnswlib

        self.vectors = vectors
        if self.params["transform"] == "padded":
            docs, self.m2 = padded(vectors)
            space = "l2"
        else:
            docs, space = vectors, "ip"
        self.index = hnswlib.Index(space=space, dim=docs.shape[1])
        self.index.init_index(
            max_elements=len(docs), M=self.params["M"], ef_construction=self.params["ef_construction"], random_seed=0
        )
        self.index.add_items(docs, np.arange(len(docs)), num_threads=self.threads)
        self.exact = None

    def search(self, h, k):
        q = as_queries(h)
        self.index.set_ef(max(self.params["ef"], k))
        if self.params["transform"] == "padded":
            q = encoding.encode_queries(q, "l2")
            ids, d = self.index.knn_query(q, k=k, num_threads=1)
            return ids.astype(np.int64), encoding.decode_dists(d, q, self.m2, "l2")
        ids, d = self.index.knn_query(q, k=k, num_threads=1)
        return ids.astype(np.int64), 1.0 - d.astype(np.float64)  # hnswlib's "ip" distance is 1 - x.y

    exact_label = "hnswlib BFIndex (ip)"

    def exact_search(self, h, k):
        import hnswlib

        if self.exact is None:
            self.exact = hnswlib.BFIndex(space="ip", dim=self.dim)
            self.exact.init_index(max_elements=self.n)
            self.exact.add_items(self.vectors, np.arange(self.n))
        ids, d = self.exact.knn_query(as_queries(h), k=k, num_threads=1)
        return ids.astype(np.int64), 1.0 - d.astype(np.float64)

    def memory_bytes(self):
        with tempfile.TemporaryDirectory() as tmp:  # hnswlib's file is its memory layout
            path = os.path.join(tmp, "index.bin")
            self.index.save_index(path)
            return os.path.getsize(path)


class _Faiss(OutputIndex):
    exact_label = "FAISS IndexFlatIP"

    def _make(self, dim):
        raise NotImplementedError

    def _build(self, vectors):
        import faiss

        faiss.omp_set_num_threads(self.threads)
        self.vectors = vectors
        docs = vectors
        if self.params.get("transform") == "padded":
            docs, self.m2 = padded(vectors)
        self.index = self._make(docs.shape[1])
        if not self.index.is_trained:
            rng = np.random.default_rng(0)
            train = docs if len(docs) <= 20000 else docs[rng.choice(len(docs), 20000, replace=False)]
            self.index.train(train)
        self.index.add(docs)
        self.flat = None

    def _search_params(self):
        return None

    def search(self, h, k):
        import faiss

        faiss.omp_set_num_threads(1)  # batch-1 latency: one thread, as the paper measures
        q = as_queries(h)
        if self.params.get("transform") == "padded":
            q = encoding.encode_queries(q, "l2")
            d, ids = self.index.search(q, k, params=self._search_params())
            scores = encoding.decode_dists(d, q, self.m2, "l2")
        else:
            d, ids = self.index.search(q, k, params=self._search_params())
            scores = d.astype(np.float64)
        faiss.omp_set_num_threads(self.threads)
        return ids.astype(np.int64), np.where(ids < 0, -np.inf, scores)

    def exact_search(self, h, k):
        import faiss

        if self.flat is None:
            self.flat = faiss.IndexFlatIP(self.dim)
            self.flat.add(self.vectors)
        faiss.omp_set_num_threads(1)
        d, ids = self.flat.search(as_queries(h), k)
        faiss.omp_set_num_threads(self.threads)
        return ids.astype(np.int64), d.astype(np.float64)

    def memory_bytes(self):
        import faiss

        return int(faiss.serialize_index(self.index).nbytes)


class FaissHNSW(_Faiss):
    kind = "faiss-hnsw"
    search_params = ("ef",)
    defaults = {"M": 32, "ef_construction": 200, "ef": 200, "transform": "ip"}

    def _make(self, dim):
        import faiss

        metric = faiss.METRIC_L2 if self.params["transform"] == "padded" else faiss.METRIC_INNER_PRODUCT
        index = faiss.IndexHNSWFlat(dim, self.params["M"], metric)
        index.hnsw.efConstruction = self.params["ef_construction"]
        return index

    def _search_params(self):
        import faiss

        return faiss.SearchParametersHNSW(efSearch=self.params["ef"])


class FaissIVF(_Faiss):
    kind = "faiss-ivf"
    search_params = ("nprobe",)
    defaults = {"nlist": 256, "nprobe": 16}

    def _make(self, dim):
        import faiss

        self.quantizer = faiss.IndexFlatIP(dim)
        return faiss.IndexIVFFlat(self.quantizer, dim, self.params["nlist"], faiss.METRIC_INNER_PRODUCT)

    def _search_params(self):
        import faiss

        return faiss.SearchParametersIVF(nprobe=self.params["nprobe"])


class FaissIVFPQ(FaissIVF):
    kind = "faiss-ivfpq"
    exact_scores = False  # distances from 8-bit product-quantised codes
    defaults = {"nlist": 256, "nprobe": 16, "m": 48, "nbits": 8}

    def _make(self, dim):
        import faiss

        if dim % self.params["m"]:
            raise Unavailable(f"faiss-ivfpq: dimension {dim} is not divisible by m={self.params['m']}")
        self.quantizer = faiss.IndexFlatIP(dim)
        return faiss.IndexIVFPQ(
            self.quantizer,
            dim,
            self.params["nlist"],
            self.params["m"],
            self.params["nbits"],
            faiss.METRIC_INNER_PRODUCT,
        )
