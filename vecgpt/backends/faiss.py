"""FAISS flat indexes (IndexFlatL2 / IndexFlatIP): exact search in float32, in process.

Environment: XDG_CACHE_HOME (the default folder). See docs/faiss.md.
"""

from __future__ import annotations

import collections
import ctypes
import os
import queue
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from vecgpt.backends import _kernel, _product, base
from vecgpt.backends._in_process import InProcessStore, Table
from vecgpt.backends._smallest import smallest
from vecgpt.errors import VecgptError

PREFERRED_METRIC = "ip"  # no pad and no decoding arithmetic: faster than l2, as exact (docs/speed.md)
UNBOUNDED = {"l2": float(np.finfo(np.float32).max), "ip": -float(np.finfo(np.float32).max)}


def threads_for(queries: np.ndarray, rows: int, dim: int, threads: int) -> None:
    # OpenMP splits work by query: for a single query its threads only add overhead, and so they do for a
    # small search (a layer's key queries over a few hundred keys), whose threads wait for a core at each
    # barrier on a busy machine. docs/faiss.md, "Threads".
    many = len(queries) > 1 and len(queries) * rows * dim >= PARALLEL_WORK
    faiss.omp_set_num_threads(usable(threads) if many else 1)


PARALLEL_WORK = 1 << 24  # multiply-adds a search needs before OpenMP's threads pay (a prompt block's)
# A search of every row with several queries (a prompt block; texts stepped together, vecgpt.stepper) scans the rows
# a block at a time, each block for every query while it is in a core's L2 cache: the rows are read from memory
# once for all the queries, and each query's sums are FAISS's one-query kernel's, whatever else is searched with it.
BLOCK_BYTES = 1 << 20
# How a search of every row is computed (docs/faiss.md, "Kernels"). "fixed" (the default): the fixed-order kernel
# (_kernel) for any number of queries, each sum in increasing dimension order: one query about as fast as "scan",
# several near numpy's sgemm. "scan": FAISS's one-query kernel for one query, its by-index kernel over blocks of rows
# for several. "blas": an inner-product search is one matrix product (_product) for any number of queries, one
# included, where the check passed for the matrix's shape (else, and for l2, "scan").
KERNELS = ("scan", "fixed", "blas")
DEFAULT_KERNEL = "fixed"
OWN_BLAS_FROM = 2  # queries from which FAISS's own search uses BLAS when a store is not invariant
# The HNSW graphs of approximate key searches (attention_index = "hnsw"): FAISS's defaults but a wider search
HNSW_M, HNSW_EF_CONSTRUCTION, HNSW_EF_SEARCH = 32, 40, 32
SPLIT_WORK = 1 << 19  # multiply-adds a one-query scan needs before its rows are split over threads
_WORKERS: dict[int, Worker] = {}  # in_threads' workers, by number
_FORKED = [False]  # this process is a forked child: every store's searches on one thread


@dataclass(frozen=True)
class Settings:
    """A store's own (connect's): its tables search with these, whatever other stores in the process use."""

    kernel: str = DEFAULT_KERNEL
    invariant: bool = True  # False: several queries take FAISS's own search (BLAS: a query's bits depend on the rest)
    threads: int = faiss.omp_get_max_threads()

    @property
    def name(self) -> str:
        """The kernel a search of every row with several queries runs (a text records it)."""
        return self.kernel if self.invariant else "faiss"


def _forked() -> None:
    """In a forked child: no worker threads, and FAISS on one thread. GNU OpenMP's threads do not survive a fork,
    and once the parent has run a parallel region, the child's next one with more than one thread waits forever."""
    _WORKERS.clear()
    _FORKED[0] = True


os.register_at_fork(after_in_child=_forked)


def usable(threads: int) -> int:
    return 1 if _FORKED[0] else threads


def row_chunks(n: int, dim: int, threads: int, align: int = 1, last: float | None = None) -> list[tuple[int, int]]:
    """A scan's rows as (start, end) per thread, each start a multiple of align: one chunk unless the scan is big.
    last: the share of the rows the last chunk (the calling thread's, in_threads) takes; None: an equal share."""
    threads = usable(threads)
    if n * dim < SPLIT_WORK or threads < 2:
        return [(0, n)]
    if last is None:  # chunk i starts at row ceil(n i / threads)
        cuts = [-(-n * i // threads) for i in range(threads)]
    else:
        cuts = [int(n * (1 - last) * i / (threads - 1)) for i in range(threads)]
    edges = [min(n, -(-c // align) * align) for c in cuts] + [n]
    return [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]


class Balance:
    """The calling thread's share of a product's rows, so that it and the workers finish together: a worker's share
    starts after a hand-over (tens of microseconds, more where an idle core wakes slowly) and may run slower on its
    core. Nudged after each product by how far apart the two finished; which thread computes a row never changes
    its sums (the fixed kernel's sums are each (query, row)'s own)."""

    def __init__(self, share: float = 0.5, step: float = 0.25, low: float = 0.3, high: float = 0.75):
        self.share, self.step, self.low, self.high = share, step, low, high

    def took(self, mine: float, theirs: float) -> None:
        """The calling thread's share finished `mine` seconds after the product began, the last worker's `theirs`."""
        if mine > 0 and theirs > 0:
            gap = (theirs - mine) / max(mine, theirs)  # > 0: the worker finished last, so the caller takes more
            self.share = min(self.high, max(self.low, self.share + self.step * gap * self.share * (1 - self.share)))


BALANCE = Balance()


@contextmanager
def own_blas():
    """FAISS's own search of several queries with BLAS from two (invariant = false), put back after."""
    before = faiss.cvar.distance_compute_blas_threshold
    faiss.cvar.distance_compute_blas_threshold = OWN_BLAS_FROM
    try:
        yield
    finally:
        faiss.cvar.distance_compute_blas_threshold = before


class Pace:
    """Who splits a big one-query scan: OpenMP's threads while they keep pace, the workers (in_threads) for a while
    after they did not. OpenMP's threads spin between scans, so a scan starts on every core at once; but with another
    busy process on the cores a thread spinning at the end of a scan holds a core the other needs. EVIDENCE scans
    within WITHIN that each took SLOW times their shape's fastest, and LATE seconds more, are taken for that; fewer
    are not (a hiccup of the host makes two close together now and then on a quiet machine). A slow scan counts only
    while more threads are runnable on the machine than it has cores (`crowded`): with none waiting, the cores were
    taken by the host, not by a process the workers could make room for, and the workers would not help. Such a scan
    also clears the count, so a long run of slow scans in a slow stretch of the host rarely gathers EVIDENCE. A
    back-off lasts BACK_OFF scans, twice the last one's if that was less than CALM scans on OpenMP's threads ago, up
    to LONGEST: a process that stays on the cores finds OpenMP's threads tried ever more rarely (each try costs its
    slow scans), and once one has gone a back-off is as short as the first again. docs/faiss.md, "Threads"."""

    SLOW = 3.0
    LATE = 0.0005
    EVIDENCE = 3
    WITHIN = 32
    BACK_OFF = 512  # scans (about ten tokens at GPT-2 small) on the workers before OpenMP's threads are tried again
    CALM = 2048
    LONGEST = 8192

    def __init__(self, crowded=None):
        self.crowded = crowded or crowded_now  # () -> bool
        self.fastest: dict[tuple[int, int], float] = {}
        self.waiting = 0  # scans left on the workers
        self.scans = 0
        self.back_off, self.backed_off_at = 0, -self.CALM  # the last back-off's scans, and the scan that set it
        self.slow: collections.deque[int] = collections.deque(maxlen=self.EVIDENCE)  # the last slow scans' numbers

    def openmp(self) -> bool:
        if self.waiting:
            self.waiting -= 1
            return False
        return True

    def took(self, shape: tuple[int, int], seconds: float) -> None:
        self.scans += 1
        fastest = self.fastest.setdefault(shape, seconds)
        if seconds <= max(self.SLOW * fastest, fastest + self.LATE):
            self.fastest[shape] = min(fastest, seconds)
            return
        if not self.crowded():  # the host took the cores: the slow scans counted before were likely its too
            self.slow.clear()
            return
        self.slow.append(self.scans)
        if len(self.slow) == self.EVIDENCE and self.scans - self.slow[0] < self.WITHIN:
            calm = self.scans - self.backed_off_at >= self.CALM
            self.back_off = self.BACK_OFF if calm else min(2 * self.back_off, self.LONGEST)
            self.waiting, self.backed_off_at = self.back_off, self.scans
            self.slow.clear()


PROC_STAT = "/proc/stat"


def crowded_now() -> bool:
    """Whether more threads are runnable on this machine than it has cores (Linux's /proc/stat); True where unknown.
    Read only after a slow scan: it opens and reads a file."""
    try:
        with open(PROC_STAT, "rb") as f:
            for line in f:
                if line.startswith(b"procs_running"):
                    return int(line.split()[1]) > (os.cpu_count() or 1)
    except (OSError, ValueError):
        pass
    return True


PACE = Pace()


def in_threads(calls, balance: Balance | None = None) -> None:
    """Run the calls at once (FAISS's kernels release the GIL): the last in this thread, each other on a worker
    kept on a core this thread is not on: a worker free to move, woken after a pause, can land on this thread's
    core, and the two shares then take turns there (docs/faiss.md, "Threads"). balance: told when each finished."""
    if len(calls) <= 1:
        return calls[0]() if calls else None
    began, ends = time.perf_counter(), [0.0] * len(calls)

    def timed(i, call):
        def run():
            call()
            ends[i] = time.perf_counter()

        return run

    if balance is not None:
        calls = [timed(i, c) for i, c in enumerate(calls)]
    running = [worker(i).start(call) for i, call in zip(elsewhere(len(calls) - 1), calls[:-1])]
    calls[-1]()
    for done, failed in running:
        done.acquire()
        if failed:
            raise failed[0]
    if balance is not None:
        balance.took(ends[-1] - began, max(ends[:-1]) - began)


def elsewhere(n: int) -> list[int]:
    """n workers' numbers, those kept on this thread's core last (worker i is kept on core CPUS[i % len(CPUS)])."""
    here = current_cpu()
    return sorted(range(n + 1), key=lambda i: bool(CPUS) and CPUS[i % len(CPUS)] == here)[:n]


class Worker:
    """A thread kept on core CPUS[i % len(CPUS)], running the calls it is given in turn: a share is handed over on a
    queue and waited for on a lock, lighter than a thread pool's future (a token hands over dozens)."""

    def __init__(self, i: int):
        self.calls: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self.run, args=(i,), name=f"vecgpt-faiss-{i}", daemon=True).start()

    def run(self, i: int) -> None:
        pin(i)
        while (item := self.calls.get()) is not None:
            call, done, failed = item
            try:
                call()
            except BaseException as e:  # raised again in the thread that waits for it
                failed.append(e)
            finally:
                done.release()

    def start(self, call) -> tuple[threading.Lock, list]:
        """Hand the call over: (a lock released when it has run, the error it raised if any)."""
        done, failed = threading.Lock(), []
        done.acquire()
        self.calls.put((call, done, failed))
        return done, failed

    def stop(self) -> None:
        self.calls.put(None)


def worker(i: int) -> Worker:
    if i not in _WORKERS:
        _WORKERS[i] = Worker(i)
    return _WORKERS[i]


def pin(i: int) -> None:
    if CPUS:
        with suppress(OSError):  # a core taken from the process since (cpuset): the worker stays free to move
            os.sched_setaffinity(0, {CPUS[i % len(CPUS)]})


def _sched_getcpu():
    try:
        return ctypes.CDLL(None).sched_getcpu
    except (AttributeError, OSError, TypeError):  # not glibc or musl: no core is preferred
        return lambda: -1


current_cpu = _sched_getcpu()
CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []  # where the OS lets threads be kept


def lines(n: int, threads: int) -> np.ndarray:
    """Row numbers 0..n-1 as `threads` lines of equal length, the last padded with -1 (which FAISS skips)."""
    out = np.full(threads * -(-n // threads), -1, np.int64)
    out[:n] = np.arange(n)
    return out.reshape(threads, -1)


ONE_QUERY = {"ip": faiss.fvec_inner_products_ny, "l2": faiss.fvec_L2sqr_ny}  # FAISS's kernels, by metric
BY_INDEX = {"ip": faiss.fvec_inner_products_by_idx, "l2": faiss.fvec_L2sqr_by_idx}


def on_openmp(q: np.ndarray, rows: np.ndarray, numbers: np.ndarray, metric: str) -> np.ndarray:
    """q [1, dim] . each of rows [n, dim] (float32, C order; l2: |q - x|^2) as FAISS's by-index kernel over the
    lines of row numbers (lines()), the query on each: OpenMP runs the lines on its threads, each row's sum the same
    as the one-query kernel's (a test checks)."""
    out = np.empty(numbers.shape, np.float32)
    x = np.repeat(q, len(numbers), axis=0)
    faiss.omp_set_num_threads(len(numbers))
    BY_INDEX[metric](
        faiss.swig_ptr(out),
        faiss.swig_ptr(x),
        faiss.swig_ptr(rows),
        faiss.swig_ptr(numbers),
        rows.shape[1],
        *numbers.shape,
    )
    return out.ravel()[: len(rows)]


def selector(slots: np.ndarray | None):
    if slots is None:
        return None
    if len(slots) and slots[-1] - slots[0] == len(slots) - 1:  # contiguous: a range costs nothing to build
        return faiss.SearchParameters(sel=faiss.IDSelectorRange(int(slots[0]), int(slots[-1]) + 1))
    return faiss.SearchParameters(sel=faiss.IDSelectorBatch(slots.astype(np.int64)))


class FaissTable(Table):
    def __init__(self, dim, metric, index=None, settings: Settings | None = None):
        super().__init__(dim, metric)
        self.settings = settings or Settings()
        self.index = index or (faiss.IndexFlatL2(dim) if metric == "l2" else faiss.IndexFlatIP(dim))
        self.rewrites = 0  # overwrite calls: an HNSW index of rows some of which changed is built again
        self.hnsw: dict[frozenset, tuple[faiss.IndexHNSWFlat, np.ndarray, int]] = {}  # approximate's, by group
        self.n = self.index.ntotal
        self._rows: np.ndarray | None = None  # _view's array, until an add moves the storage
        self._lines: np.ndarray | None = None  # row numbers as OpenMP's threads split them (on_openmp)

    def _view(self) -> np.ndarray:
        # IndexFlat has no update; writing through a view of its storage overwrites a row in place.
        if self._rows is None:
            self._rows = faiss.rev_swig_ptr(self.index.get_xb(), self.n * self.dim).reshape(self.n, self.dim)
        return self._rows

    def append(self, vectors):
        self.index.add(np.ascontiguousarray(vectors))
        self.n, self._rows, self._lines = self.index.ntotal, None, None

    def overwrite(self, slots, vectors):
        self.rewrites += 1
        self._view()[slots] = vectors

    def vectors(self, slots):
        return self._view()[slots].copy()

    def _sign(self, d):  # FAISS gives inner products for IP; the protocol wants lower-is-better
        return -d if self.metric == "ip" else d

    def all_dists(self, queries, slots):
        if slots is not None:  # a filtered search: FAISS's by-index kernel over the matching rows
            dists = self.all_dists_groups(queries[None], slots[None])[0]
            return dists, np.broadcast_to(slots, dists.shape)
        if self.settings.invariant or len(queries) == 1:
            return self.invariant_rows(queries), None  # every row, in slot order
        self.ran = "faiss"
        threads_for(queries, self.n, self.dim, self.settings.threads)  # FAISS's own search: BLAS from two queries
        with own_blas():
            _, d, found = self.index.range_search(np.ascontiguousarray(queries), UNBOUNDED[self.metric])
        return self._sign(d.reshape(len(queries), -1)), found.reshape(len(queries), -1)

    def invariant_rows(self, queries) -> np.ndarray:
        """Queries against every row [m, n] (lower is nearer), by the store's kernel: each row's bits its query's alone."""
        if self.blas():
            return self.by_product(queries)
        if self.settings.kernel == "fixed" and self.n:
            return self.by_fixed(queries)
        self.ran = "scan"
        return self.every_row(queries) if len(queries) == 1 else self.every_row_many(queries)

    def by_fixed(self, queries) -> np.ndarray:
        """The fixed-order kernel on the index's own rows, the rows split over the threads (a thread's share starts
        at a whole tile; each sum is the same whoever computes it)."""
        self.ran = "fixed"
        q, x = np.ascontiguousarray(queries, np.float32), self._view()
        out = np.empty((len(q), self.n), np.float32)
        tile = _kernel.TILE_ROWS[np.dtype(np.float32)]
        chunks = row_chunks(self.n, self.dim * len(q), self.settings.threads, tile, BALANCE.share)
        in_threads([lambda a=a, b=b: _kernel.rows(q, x, self.metric, out, a, b) for a, b in chunks], BALANCE)
        return np.negative(out, out=out) if self.metric == "ip" else out

    def blas(self) -> bool:
        """Whether a search of every row is the checked product: inner product only (l2's product form would add
        |q|^2 and |x|^2 to it, another rounding than FAISS's own l2 sums, which the tolerance is derived for)."""
        s = self.settings
        return (
            s.invariant and s.kernel == "blas" and self.metric == "ip" and self.n > 0 and _product.holds(self._view())
        )

    def by_product(self, queries) -> np.ndarray:
        """Queries against every row [m, n] as one BLAS product (numpy's; its threads are numpy's BLAS threads)."""
        self.ran = "blas"
        d = _product.product(queries, self._view())
        return np.negative(d, out=d)

    def every_row_many(self, queries) -> np.ndarray:
        """Several queries against every row [m, n]: FAISS's by-index kernel (the one-query kernel's sums) over
        blocks of rows that stay in cache while every query scans them, the rows split over the threads."""
        q = np.ascontiguousarray(queries, np.float32)
        out, block = np.empty((len(q), self.n), np.float32), max(1, BLOCK_BYTES // (4 * self.dim))
        kernel, xb = BY_INDEX[self.metric], self.index.get_xb()

        def scan(a, b):
            def run():
                faiss.omp_set_num_threads(1)
                for s in range(a, b, block):
                    e = min(b, s + block)
                    ids = np.ascontiguousarray(np.broadcast_to(np.arange(s, e), (len(q), e - s)))
                    part = np.empty(ids.shape, np.float32)
                    kernel(faiss.swig_ptr(part), faiss.swig_ptr(q), xb, faiss.swig_ptr(ids), self.dim, *ids.shape)
                    out[:, s:e] = part

            return run

        in_threads([scan(a, b) for a, b in row_chunks(self.n, self.dim * len(q), self.settings.threads)])
        return np.negative(out, out=out) if self.metric == "ip" else out

    def every_row(self, queries) -> np.ndarray:
        """One query against every row: FAISS's one-query kernel (inner products, or squared L2 distances) over the
        stored rows. A decode step's matrix search: cheaper than a range search, which also collects its results one
        by one, and a big one is split by rows over the threads, as BLAS splits numpy's (FAISS splits by query: one
        query would get one core; docs/faiss.md)."""
        q = np.ascontiguousarray(queries, np.float32)
        if self.n == 0:
            return np.zeros((1, 0), np.float32)
        chunks = row_chunks(self.n, self.dim, self.settings.threads)
        if len(chunks) > 1 and PACE.openmp():
            start = time.perf_counter()
            if self._lines is None or len(self._lines) != len(chunks):
                self._lines = lines(self.n, len(chunks))
            d = on_openmp(q, self._view(), self._lines, self.metric)
            PACE.took((self.n, self.dim), time.perf_counter() - start)
        else:
            d = self._on_workers(q, chunks)
        return (np.negative(d, out=d) if self.metric == "ip" else d)[None]

    def _on_workers(self, q: np.ndarray, chunks: list[tuple[int, int]]) -> np.ndarray:
        d, xb, kernel = np.empty(self.n, np.float32), self._view(), ONE_QUERY[self.metric]

        def scan(a, b):
            return lambda: kernel(faiss.swig_ptr(d[a:b]), faiss.swig_ptr(q), faiss.swig_ptr(xb[a:b]), self.dim, b - a)

        in_threads([scan(a, b) for a, b in chunks])
        return d

    def all_dists_groups(self, queries, slots):
        """Each group's queries against its rows (a layer's heads, each over its own keys): one call of FAISS's by-index
        kernel for them all. A range search with a selector would visit every row of the table (a text's keys of
        every layer and head), and a call per group costs more than the kernel's work."""
        groups, m, _ = queries.shape
        x = np.ascontiguousarray(queries.reshape(groups * m, self.dim), np.float32)
        ids = np.ascontiguousarray(slots if m == 1 else np.repeat(slots, m, axis=0), np.int64)  # each query's rows
        out = np.empty(ids.shape, np.float32)
        if out.size:
            threads_for(x, ids.shape[1], self.dim, self.settings.threads)
            BY_INDEX[self.metric](
                faiss.swig_ptr(out), faiss.swig_ptr(x), self.index.get_xb(), faiss.swig_ptr(ids), self.dim, *ids.shape
            )
        return self._sign(out).reshape(groups, m, ids.shape[1])

    def topk(self, queries, k, slots):
        if k == 0:
            return np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
        invariant = self.settings.invariant
        if slots is None and (len(queries) == 1 or invariant):  # the token search: every row by the store's kernel
            d = self.invariant_rows(queries)
            found = smallest(d, k)
            return np.take_along_axis(d, found, 1), found
        if invariant and len(queries) > 1:  # a filtered search, a query at a time (FAISS's own: BLAS from 20)
            parts = [self.topk(queries[i : i + 1], k, slots) for i in range(len(queries))]
            return np.concatenate([d for d, _ in parts]), np.concatenate([f for _, f in parts])
        if slots is None:
            self.ran = "faiss"
        threads_for(queries, self.n if slots is None else len(slots), self.dim, self.settings.threads)
        with own_blas():
            d, found = self.index.search(np.ascontiguousarray(queries), k, params=selector(slots))
        return self._sign(d), found

    def within(self, queries, radius, slots):
        """A radius search: FAISS's range search (its one-query kernels' sums), the filter as its selector, a call for
        each radius (it takes one). It keeps d < radius (l2) or a product > radius (ip), in float32: the radius sent
        is the float32 next to the last distance kept (base.float32_at_most), so a row exactly at it is kept."""
        q, out, params = np.ascontiguousarray(queries, np.float32), [None] * len(queries), selector(slots)
        for r in np.unique(radius):
            at = np.flatnonzero(radius == r)
            last = base.float32_at_most(float(r))
            bound = np.nextafter(last, np.float32(np.inf)) if self.metric == "l2" else -last
            if self.metric == "ip":  # FAISS keeps products > bound: those >= -last
                bound = np.nextafter(bound, np.float32(-np.inf))
            faiss.omp_set_num_threads(1)
            lims, d, found = self.index.range_search(q[at], float(bound), params=params)
            for j, i in enumerate(at.tolist()):
                out[i] = (self._sign(d[lims[j] : lims[j + 1]]), found[lims[j] : lims[j + 1]])
        return out

    def approximate(self, queries, k, within, allowed, group):
        """The k nearest of the rows `allowed` (ascending slots, all in `within`) by an HNSW graph of the rows `within`
        (a group: one layer and head of a text's keys), kept between searches and extended as rows are appended;
        (distances [m, k], slots or -1 where the graph found fewer, distances computed)."""
        graph = self.graph(within, group)
        place = np.searchsorted(within, allowed)
        sel = (
            faiss.IDSelectorRange(int(place[0]), int(place[-1]) + 1)
            if place[-1] - place[0] == len(place) - 1
            else faiss.IDSelectorBatch(place.astype(np.int64))
        )
        params = faiss.SearchParametersHNSW(sel=sel, efSearch=max(HNSW_EF_SEARCH, k))
        faiss.omp_set_num_threads(1)
        faiss.cvar.hnsw_stats.reset()
        d, labels = graph.search(np.ascontiguousarray(queries), k, params=params)
        scored = int(faiss.cvar.hnsw_stats.ndis)
        return self._sign(d), np.where(labels >= 0, within[np.maximum(labels, 0)], -1), scored

    def graph(self, within: np.ndarray, group: frozenset) -> faiss.IndexHNSWFlat:
        """The group's HNSW graph over `within`: the one held, with the rows appended since added, or a new one when
        a row of it was rewritten (a text stepped back) or it holds other rows."""
        held = self.hnsw.get(group)
        if held is None or held[2] != self.rewrites or not np.array_equal(within[: len(held[1])], held[1]):
            metric = faiss.METRIC_L2 if self.metric == "l2" else faiss.METRIC_INNER_PRODUCT
            held = (faiss.IndexHNSWFlat(self.dim, HNSW_M, metric), within[:0], self.rewrites)
            held[0].hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        graph, built, _ = held
        if len(within) > len(built):
            faiss.omp_set_num_threads(1)  # one thread: the graph is the same whatever the machine
            graph.add(np.ascontiguousarray(self.vectors(within[len(built) :])))
        self.hnsw[group] = (graph, within.copy(), self.rewrites)
        return graph

    def copy(self):
        return FaissTable(self.dim, self.metric, faiss.clone_index(self.index), self.settings)

    def save(self, folder: Path):
        faiss.write_index(self.index, str(folder / "index.faiss"))

    @classmethod
    def load(cls, folder, dim, metric, settings: Settings | None = None):
        return cls(dim, metric, faiss.read_index(str(folder / "index.faiss")), settings)


class FaissStore(InProcessStore):
    table_class = FaissTable
    backend = "faiss"
    indexes = ("hnsw",)  # Search.index: an HNSW graph per group of a text's keys (FaissTable.approximate)

    def __init__(self, path: str | None = None, settings: Settings | None = None):
        super().__init__(path)
        self.settings = settings or Settings()
        self.table_options = {"settings": self.settings}

    @property
    def kernel(self) -> str:
        """The kernel its searches of every row run: "scan", "fixed", "blas" (where a matrix's shape fails the
        product's check: "scan"), or "faiss" (invariant = false)."""
        return self.settings.name


def connect(
    path: str | None = None, threads: int | None = None, invariant: bool = True, kernel: str = DEFAULT_KERNEL
) -> FaissStore:
    """invariant=False: several queries take FAISS's own search (BLAS), so a query's result depends on the others
    sent with it (texts sharing rounds then differ from alone in the last bits; docs/batching.md). kernel: "fixed" (the
    fixed-order kernel, the default), "scan" (FAISS's own kernels, a query at a time) or "blas" (one checked matrix
    product).
    The settings are this store's alone; nothing module-wide changes."""
    if kernel not in KERNELS:
        raise VecgptError(f"faiss: kernel {kernel!r} is not one of {', '.join(KERNELS)}; set [store] kernel to one")
    return FaissStore(path, Settings(kernel, invariant, threads or faiss.omp_get_max_threads()))
