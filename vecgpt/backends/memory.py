"""In-memory exact store in numpy: float32 vectors, distances computed in float64 (the yardstick).

Environment: XDG_CACHE_HOME (the default folder). See docs/memory.md.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vecgpt.backends import _kernel, _product, base
from vecgpt.backends._in_process import InProcessStore, Table, grow
from vecgpt.backends._smallest import smallest
from vecgpt.errors import VecgptError

# How a search of every row computes its float64 products (docs/memory.md): "gemv", a query at a time (BLAS's
# matrix-vector product); "fixed", the fixed-order kernel (_kernel) for any number of queries; "blas", one float64
# matrix product (_product) for any number of queries where the check passed for the matrix's shape (else "gemv").
# A filtered search is "gemv" whatever the kernel.
KERNELS = ("gemv", "fixed", "blas")
DEFAULT_KERNEL = "fixed"


class NumpyTable(Table):
    def __init__(self, dim, metric, data: np.ndarray | None = None, kernel: str = DEFAULT_KERNEL):
        super().__init__(dim, metric)
        self.kernel = kernel
        self._data = np.zeros((0, dim), np.float64) if data is None else data.astype(np.float64)
        self.n = len(self._data)
        self._norms = np.einsum("ij,ij->i", self._data, self._data)

    def append(self, vectors):
        n = self.n
        self._data = grow(self._data, n, vectors)  # rows past n are spare; float32 widened as it is copied in
        v = self._data[n : n + len(vectors)]
        self._norms = grow(self._norms, n, np.einsum("ij,ij->i", v, v))
        self.n += len(v)

    def overwrite(self, slots, vectors):
        v = vectors.astype(np.float64)
        self._data[slots], self._norms[slots] = v, np.einsum("ij,ij->i", v, v)

    def vectors(self, slots):
        return self._data[slots].astype(np.float32)

    def all_dists(self, queries, slots):
        data, norms = (
            (self._data[: self.n], self._norms[: self.n]) if slots is None else (self._data[slots], self._norms[slots])
        )
        q = queries.astype(np.float64)
        chosen = np.broadcast_to(np.arange(self.n) if slots is None else slots, (len(q), len(data)))
        products = self.products(q, data, slots is None)
        if self.metric == "ip":
            return -products, chosen
        return np.maximum(norms[None, :] + np.einsum("ij,ij->i", q, q)[:, None] - 2 * products, 0.0), chosen

    def products(self, q: np.ndarray, data: np.ndarray, every_row: bool) -> np.ndarray:
        """q [m, dim] . each row of data [n, dim] in float64: a search of every row as the checked product, else a
        query at a time (BLAS's matrix-vector product), whose sums never depend on the queries beside it."""
        if every_row and self.kernel == "blas" and len(data) and _product.holds(data):
            self.ran = "blas"
            return _product.product(q, data)
        if every_row and self.kernel == "fixed":
            self.ran = "fixed"
            return _kernel.rows(q, data, "ip")
        if every_row:
            self.ran = "gemv"
        return np.stack([data @ row for row in q]) if len(q) else np.zeros((0, len(data)))

    def topk(self, queries, k, slots):
        dists, chosen = self.all_dists(queries, slots)  # [m, n]
        chosen = chosen[0]
        if not base.ascending(chosen):  # ties go to the lowest slot: the columns in slot order
            order = np.argsort(chosen)
            dists, chosen = dists[:, order], chosen[order]
        cols = smallest(dists, k)
        return np.take_along_axis(dists, cols, 1), chosen[cols]

    def copy(self):
        return NumpyTable(self.dim, self.metric, self._data[: self.n], self.kernel)  # astype copies

    def save(self, folder: Path):
        np.save(folder / "vectors.npy", self._data[: self.n].astype(np.float32))

    @classmethod
    def load(cls, folder, dim, metric, kernel: str = DEFAULT_KERNEL):
        return cls(dim, metric, np.load(folder / "vectors.npy"), kernel)


class MemoryStore(InProcessStore):
    table_class = NumpyTable
    backend = "memory"

    def __init__(self, path: str | None = None, kernel: str = DEFAULT_KERNEL):
        super().__init__(path)
        self.kernel = kernel  # the kernel its searches of every row run (a text records it)
        self.table_options = {"kernel": kernel}


def connect(path: str | None = None, kernel: str = DEFAULT_KERNEL) -> MemoryStore:
    """kernel: "gemv" (a query at a time), "fixed" (the fixed-order kernel) or "blas" (one checked float64 matrix
    product for every query count). This store's alone: nothing module-wide changes."""
    if kernel not in KERNELS:
        raise VecgptError(f"memory: kernel {kernel!r} is not one of {', '.join(KERNELS)}; set [store] kernel to one")
    return MemoryStore(path, kernel)
