"""FAISS flat indexes (IndexFlatL2 / IndexFlatIP): exact search in float32, in process.

Environment: XDG_CACHE_HOME (the default folder). See docs/faiss.md.
"""

from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np

from vecgpt.backends._in_process import InProcessStore, Table

UNBOUNDED = {"l2": float(np.finfo(np.float32).max), "ip": -float(np.finfo(np.float32).max)}


def threads_for(queries: np.ndarray) -> None:
    # OpenMP splits work by query; for a single query its threads only add overhead (a 50,257-row
    # scan took 26 ms with 2 threads and 9 ms with 1 here), so one query runs on one thread.
    faiss.omp_set_num_threads(1 if len(queries) == 1 else THREADS[0])


THREADS = [faiss.omp_get_max_threads()]


def selector(slots: np.ndarray | None):
    if slots is None:
        return None
    if len(slots) and slots[-1] - slots[0] == len(slots) - 1:  # contiguous: a range costs nothing to build
        return faiss.SearchParameters(sel=faiss.IDSelectorRange(int(slots[0]), int(slots[-1]) + 1))
    return faiss.SearchParameters(sel=faiss.IDSelectorBatch(slots.astype(np.int64)))


class FaissTable(Table):
    def __init__(self, dim, metric, index=None):
        super().__init__(dim, metric)
        self.index = index or (faiss.IndexFlatL2(dim) if metric == "l2" else faiss.IndexFlatIP(dim))
        self.n = self.index.ntotal

    def _view(self) -> np.ndarray:
        # IndexFlat has no update; writing through a view of its storage overwrites a row in place.
        return faiss.rev_swig_ptr(self.index.get_xb(), self.n * self.dim).reshape(self.n, self.dim)

    def append(self, vectors):
        self.index.add(np.ascontiguousarray(vectors))
        self.n = self.index.ntotal

    def overwrite(self, slots, vectors):
        self._view()[slots] = vectors

    def vectors(self, slots):
        return self._view()[slots].copy()

    def _sign(self, d):  # FAISS gives inner products for IP; the protocol wants lower-is-better
        return -d if self.metric == "ip" else d

    def all_dists(self, queries, slots):
        if slots is not None and len(slots) == 0:
            return np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
        threads_for(queries)
        _, d, found = self.index.range_search(
            np.ascontiguousarray(queries), UNBOUNDED[self.metric], params=selector(slots)
        )
        return self._sign(d.reshape(len(queries), -1)), found.reshape(len(queries), -1)

    def topk(self, queries, k, slots):
        if k == 0:
            return np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
        threads_for(queries)
        d, found = self.index.search(np.ascontiguousarray(queries), k, params=selector(slots))
        return self._sign(d), found

    def copy(self):
        return FaissTable(self.dim, self.metric, faiss.clone_index(self.index))

    def save(self, folder: Path):
        faiss.write_index(self.index, str(folder / "index.faiss"))

    @classmethod
    def load(cls, folder, dim, metric):
        return cls(dim, metric, faiss.read_index(str(folder / "index.faiss")))


class FaissStore(InProcessStore):
    table_class = FaissTable
    backend = "faiss"


def connect(path: str | None = None, threads: int | None = None) -> FaissStore:
    if threads:
        THREADS[0] = threads
    return FaissStore(path)
