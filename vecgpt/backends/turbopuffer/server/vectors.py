"""A namespace's vectors as it was sent them: float32, in chunks of about CHUNK_BYTES, each held by dimension
([dim, rows]: a --float32 scan adds one dimension of every row at a time), every chunk but the last full, each row's squared norm (float64) beside it. Growing allocates at most one
chunk (the last grows to what a write needs, or doubles when that is less than an eighth more, until full; then
a new one starts), never a second copy of the namespace: a bulk load leaves no room unused, and small appends
(a text's keys) are not copied each time. Chunks of MAPPED_BYTES or more are mapped memory of their own: pages not yet written take
no memory, and a chunk let go goes back to the system at once (not to the heap, where live blocks could hold it)."""

from __future__ import annotations

import mmap

import numpy as np

CHUNK_BYTES = 32 * 2**20
BLOCK_BYTES = 2**20  # float32 a float64 scan widens at a time
MAPPED_BYTES = 2**20


class Rows:
    """Row `s` is column `s % per` of chunk `s // per`; slots are numbered by the namespace."""

    def __init__(self, dim: int):
        self.dim = dim
        self.per = max(1, CHUNK_BYTES // (4 * dim))
        self.block = max(1, BLOCK_BYTES // (4 * dim))
        self.chunks: list[np.ndarray] = []  # [dim, capacity] float32
        self.norms: list[np.ndarray] = []  # [capacity] float64

    @property
    def capacity(self) -> int:
        return self.per * (len(self.chunks) - 1) + self.chunks[-1].shape[1] if self.chunks else 0

    def reserve(self, total: int, held: int) -> None:
        """Room for `total` rows, `held` of them in use. All of a write's allocation happens here, before the
        namespace changes: out of memory, it raises MemoryError and leaves the rows as they were."""
        while self.capacity < total:
            if self.chunks and self.chunks[-1].shape[1] < self.per:
                last, had = len(self.chunks) - 1, self.chunks[-1].shape[1]
                want = min(self.per, total - self.per * last)
                cap = want if 8 * (want - had) >= had else min(self.per, max(want, 2 * had))
                used = max(0, held - self.per * last)
                grown = _grown(self.chunks[-1], (self.dim, cap), used), _grown(self.norms[-1], (cap,), used)
                self.chunks[-1], self.norms[-1] = grown
            else:
                cap = min(self.per, max(total - self.capacity, 16))
                chunk, norms = allocate((self.dim, cap), np.float32), allocate((cap,), np.float64)
                self.chunks.append(chunk)
                self.norms.append(norms)

    def put(self, slots: np.ndarray, vectors: np.ndarray, norms: np.ndarray) -> None:
        """Rows `vectors` [k, dim] (float32) with their `norms` into `slots` (reserved)."""
        for c, mine, at in self._by_chunk(slots):
            self.chunks[c][:, at] = vectors[mine].T
            self.norms[c][at] = norms[mine]

    def get(self, slots: np.ndarray) -> np.ndarray:
        """The rows in `slots`, float32 [len(slots), dim]."""
        out = np.empty((len(slots), self.dim), np.float32)
        for c, mine, at in self._by_chunk(slots):
            out[mine] = self.chunks[c][:, at].T
        return out

    def move(self, src: int, dst: int) -> None:
        (a, i), (b, j) = divmod(src, self.per), divmod(dst, self.per)
        self.chunks[b][:, j], self.norms[b][j] = self.chunks[a][:, i], self.norms[a][i]

    def truncate(self, held: int) -> None:
        """Free the chunks past the first `held` rows."""
        keep = -(-held // self.per)
        del self.chunks[keep:], self.norms[keep:]

    def copy(self, held: int) -> Rows:
        """An independent copy of the first `held` rows, a chunk at a time."""
        out = Rows(self.dim)
        for c in range(-(-held // self.per)):
            used = min(self.per, held - c * self.per)
            out.chunks.append(_grown(self.chunks[c], (self.dim, used), used))
            out.norms.append(_grown(self.norms[c], (used,), used))
        return out

    def blocks(self, rows: np.ndarray, held: int, most: int | None = None):
        """(vectors by dimension [dim, m] float32, norms [m]) of `rows` (ascending slots), in order, at most `most`
        rows (default: a chunk) at a time: views where the rows are one run, copies otherwise."""
        most = most or self.per
        if len(rows) and rows[-1] - rows[0] == len(rows) - 1:
            start, stop = int(rows[0]), int(rows[-1]) + 1
            while start < stop:
                c, at = divmod(start, self.per)
                end = at + min(stop - start, most, self.per - at)
                yield self.chunks[c][:, at:end], self.norms[c][at:end]
                start += end - at
            return
        for first in range(0, len(rows), most):
            part = rows[first : first + most]
            vectors, norms = np.empty((self.dim, len(part)), np.float32), np.empty(len(part))
            for c, mine, at in self._by_chunk(part):
                vectors[:, mine], norms[mine] = self.chunks[c][:, at], self.norms[c][at]
            yield vectors, norms

    def _by_chunk(self, slots: np.ndarray):
        """(chunk, which of `slots` are in it, their columns there) for each chunk `slots` touch; slices where
        they are a run (an append), which numpy copies far faster than a list of columns."""
        where, at = np.divmod(np.asarray(slots, np.int64), self.per)
        if len(where) and where[0] == where[-1] and (where == where[0]).all():
            yield int(where[0]), slice(None), _run(at)
            return
        for c in np.unique(where):
            mine = where == c
            yield int(c), mine, _run(at[mine])


def _run(at: np.ndarray):
    """`at` as a slice where it is one ascending run, else itself."""
    if len(at) and at[-1] - at[0] == len(at) - 1 and (len(at) == 1 or (np.diff(at) == 1).all()):
        return slice(int(at[0]), int(at[-1]) + 1)
    return at


def squared_norms(vectors: np.ndarray) -> np.ndarray:
    """Each float32 row's squared norm in float64, a block of rows at a time."""
    out = np.empty(len(vectors))
    step = max(1, BLOCK_BYTES // (4 * max(1, vectors.shape[1])))
    for start in range(0, len(vectors), step):
        v = vectors[start : start + step].astype(np.float64)
        out[start : start + step] = np.einsum("ij,ij->i", v, v)
    return out


def allocate(shape: tuple, dtype) -> np.ndarray:
    """An uninitialised array; from MAPPED_BYTES up in mapped memory of its own (out of it: MemoryError)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if nbytes < MAPPED_BYTES:
        return np.empty(shape, dtype)
    try:
        return np.frombuffer(mmap.mmap(-1, nbytes), dtype).reshape(shape)
    except OSError as e:
        raise MemoryError(f"cannot map {nbytes:,} bytes: {e.strerror}") from None


def _grown(old: np.ndarray, shape: tuple, used: int) -> np.ndarray:
    """`old`'s first `used` rows (its last axis) in a new array of `shape`."""
    new = allocate(shape, old.dtype)
    new[..., :used] = old[..., :used]
    return new
