"""The store protocol every backend implements, and the registry that finds backends by name.

A backend is a module (or a package's `__init__.py`) of vecgpt/backends with a top-level
`connect(**options) -> Store` (its file is its registration; `_`-modules are helpers), or a `connect`
that another package declares in the entry point group `vecgpt.stores`, e.g. in its pyproject.toml:

    [project.entry-points."vecgpt.stores"]
    mystore = "mypackage.store:connect"

A collection is a named set of float32 vectors of one dimension, each with an integer id and
integer attributes, and optionally a float32 payload (a fixed number of floats per row, stored and
fetched, never filtered on or ranked by: a text keeps each key's value there). Ids are row indices
chosen by the caller, so results scatter straight into numpy. Distances are squared L2 ("l2") or the
negated inner product ("ip"), lower is better.

Texts. Collections named `text-<id>` hold a text's keys and values; rows written there survive the
writing process and kill -9. Beside them, each text has a record (a JSON object) that is versioned:
`write_text` succeeds only if the version it expects is still the stored one, so two processes never
interleave edits of one text (see vecgpt/text.py).

Optional beside connect(), in the same module: `estimate_cost(rows, **options) -> str`, what a load
into this store costs (`vecgpt load --dry-run` prints it; rows as `vecgpt.loading.plan` gives them).
"""

from __future__ import annotations

import ast
import contextvars
import functools
import importlib
import inspect
import json
import os
import pkgutil
import re
import threading
import types
import typing
from collections import abc
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import NamedTuple, Protocol, TypeVar, runtime_checkable

import numpy as np

from vecgpt.encoding import Metric
from vecgpt.errors import TextConflict, VecgptError
from vecgpt.paths import expand

GROUP = "vecgpt.stores"
T = TypeVar("T")


@dataclass(frozen=True)
class Where:
    """Rows whose attributes satisfy every condition: attr == v, attr < v, attr >= v."""

    eq: Mapping[str, int] = field(default_factory=dict)
    lt: Mapping[str, int] = field(default_factory=dict)
    ge: Mapping[str, int] = field(default_factory=dict)

    def attributes(self) -> set[str]:
        return set(self.eq) | set(self.lt) | set(self.ge)

    def conditions(self) -> set[tuple]:
        """Each condition as (ufunc, attribute, value)."""
        ops = ((np.equal, self.eq), (np.less, self.lt), (np.greater_equal, self.ge))
        return {(op, name, value) for op, conditions in ops for name, value in conditions.items()}

    def mask(self, attrs: Mapping[str, np.ndarray], n: int) -> np.ndarray:
        """Which of n rows match, given their attribute columns (for stores that filter in numpy)."""
        return matching(self.conditions(), {a: column[:n] for a, column in attrs.items()}, n)


def matching(conditions, columns: Mapping[str, np.ndarray], n: int) -> np.ndarray:
    """Which of n rows satisfy every condition (Where.conditions), given the rows' attribute columns."""
    keep = None
    for op, name, value in conditions:
        keep = op(columns[name], value) if keep is None else keep & op(columns[name], value)
    return np.ones(n, bool) if keep is None else keep


TEXT_PREFIX = "text-"  # a text's collections: text-<id> (its keys, tagged layer/head/position) and text-<id>.<suffix>


def is_text(name: str) -> bool:
    """A text's collection (written every token, kept as it is written), not a model's (written once, at a load)."""
    return name.startswith(TEXT_PREFIX)


@functools.cache
def row_order(n: int) -> np.ndarray:
    """0..n-1, one read-only array per n. A store that finds every row of a search in row order may answer with
    views of it as the ids, and the engine then knows the order without comparing them (about 50 a token)."""
    order = np.arange(n)
    order.flags.writeable = False
    return order


def stacked(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """np.stack of arrays of one shape, without its checks (a third of the time for a layer's 12 heads)."""
    return np.concatenate(arrays).reshape(len(arrays), *arrays[0].shape)


class Hits(NamedTuple):
    """A search's rows. A radius search's (Search.radius) are ragged: n is the most rows any query (of any group)
    found, each query's rows nearest first (ties by id), padded after them with id -1 and distance inf."""

    ids: np.ndarray  # [m, n] int64
    dists: np.ndarray  # [m, n] in the store's precision (float64 where it gives it)
    vectors: np.ndarray | None = None  # [m, n, dim] float32, the rows as stored, where the Search asked for them
    scored: int | None = None  # rows the store computed a distance for, where it knows (an ANN index: Search.index)


def no_hits(m: int, dim: int | None = None) -> Hits:
    """No rows for m queries (dim: with vectors of that width, for a Search that asked for them)."""
    vectors = None if dim is None else np.zeros((m, 0, dim), np.float32)
    return Hits(np.zeros((m, 0), np.int64), np.zeros((m, 0)), vectors)


@dataclass(frozen=True)
class Search:
    """One search request: for `search_many`, which may send several at once."""

    collection: str
    queries: np.ndarray  # [m, dim] float32
    k: int | None = None  # None: every matching row, in any order; else the k nearest, nearest first
    where: Where | None = None
    # also the rows' stored vectors (Hits.vectors), as fetch gives them: the token search's, so the next token's
    # embedding needs no round of its own. A store that cannot answers None, and the engine fetches them.
    vectors: bool = False
    # A grouped search (search_many only): queries [G, m, dim], group g searching the rows that match `where` and
    # whose attribute `by` equals g (`where` may not test `by`); one Hits for them all, [G, m, n] (a layer's heads,
    # n keys each). Every group must match as many rows (else VecgptError). A store sets `groups = True` to take
    # these itself; any other is sent a Search per group (`apart`).
    by: str | None = None
    # An approximate search (with k): the store's index of that kind (one of its `indexes`, e.g. "hnsw") over the
    # rows that match `where`'s equalities, its ranges applied as the index's filter. None: exact.
    index: str | None = None
    # A radius search: a radius per query ([m]; grouped: [G, m]) in the store's distance. Each query gets every row
    # matching `where` at a distance <= its radius (a row exactly at it included), with k at most the k nearest of
    # them; ragged Hits (see Hits), never vectors, never an index. None: no radius.
    radius: np.ndarray | None = None


@runtime_checkable
class Store(Protocol):
    metrics: tuple[Metric, ...]  # the distances this store can rank by

    def create(self, name: str, dim: int, metric: Metric, attrs: Sequence[str] = (), payload: int = 0) -> None:
        """Make an empty collection (a no-op if it exists with the same dim and metric); `payload` floats a row."""

    def upsert(
        self,
        name: str,
        ids: np.ndarray,
        vectors: np.ndarray,
        attrs: Mapping[str, np.ndarray] | None = None,
        payload: np.ndarray | None = None,
    ) -> None:
        """Insert rows, replacing any row with the same id (payload [n, width] float32; None: zeros)."""

    def search(self, name: str, queries: np.ndarray, k: int | None = None, where: Where | None = None) -> Hits:
        """Exact search: every matching row (k None, any order) or the k nearest, nearest first."""

    def search_many(self, searches: Sequence[Search]) -> list[Hits]:
        """Several independent searches, sent together where the store can; a Search with `vectors` also gets
        its rows' vectors (Hits.vectors), in the same request."""

    def fetch(self, name: str, ids: np.ndarray, payload: bool = False):
        """The stored vectors [len(ids), dim] for these ids, in that order; with payload, (vectors, payload)."""

    def count(self, name: str) -> int: ...

    def drop(self, name: str) -> None:
        """Remove a collection (a no-op if it does not exist)."""

    def collections(self) -> list[str]: ...

    def read_manifest(self, key: str) -> dict | None:
        """The record of one loaded model, filed under its key (vecgpt.loading.store_fingerprint), or None."""

    def write_manifest(self, key: str, manifest: dict | None) -> None:
        """File (None: remove) a model's record. Writing it marks the model's load complete."""

    def manifests(self) -> list[str]:
        """The keys of every record filed (from the store's own catalog, never a listing of collections)."""

    def stats(self) -> dict:
        """Documents and bytes held, by collection."""

    def read_text(self, text_id: str) -> dict | None:
        """A text's record, with its "version", or None."""

    def write_text(self, text_id: str, record: dict | None, expect: int | None) -> int:
        """File a text's record (None: remove it) if its stored version is `expect` (None: if it has none);
        else raise TextConflict. Atomic: readers see the old record or the new. Returns the new version."""

    def texts(self) -> list[str]:
        """The ids of every text record."""

    def close(self) -> None: ...

    # Optional: `clone(src, dst)`, a new collection dst holding every row of src, made inside the store
    # (no row passes through the client); a text branches by it. `text_lock(text_id)`, a context manager
    # held while a process has the text open; another process's attempt fails at once (never waits).

    # Optional: `load_lock()`, a context manager that keeps other processes' loads out of this store while
    # one runs (see loading.push). Stores without it take no lock.

    # Optional: `groups = True`, a class attribute: search_many takes grouped Searches (Search.by) as they are.

    # Optional: `indexes`, a class attribute: the approximate indexes a Search may name (Search.index), e.g. ("hnsw",).


def apart(search_many, searches: Sequence[Search]) -> list[Hits]:
    """search_many(searches) for a store that searches group by group: a grouped Search sent as a Search per group
    (its `by` attribute an equality of each one's filter), their hits stacked into the grouped search's."""
    if not any(s.by for s in searches):
        return search_many(searches)
    plain, spans = [], []
    for s in searches:
        parts = each_group(s) if s.by else [s]
        spans.append((len(plain), len(parts), bool(s.by)))
        plain += parts
    found = search_many(plain)
    return [joined(s, found[a : a + n]) if grouped else found[a] for s, (a, n, grouped) in zip(searches, spans)]


def each_group(s: Search) -> list[Search]:
    """A grouped Search (Search.by) as one plain Search per group."""
    where = group_filter(s)
    radius = check_radius(s, np.shape(s.queries)[:-1])
    return [
        Search(
            s.collection,
            q,
            s.k,
            Where({**where.eq, s.by: g}, where.lt, where.ge),
            s.vectors,
            index=s.index,
            radius=None if radius is None else radius[g],
        )
        for g, q in enumerate(s.queries)
    ]


def group_filter(s: Search) -> Where:
    """A grouped search's filter (none: every row), which must leave its `by` attribute to the groups."""
    where = s.where or Where()
    if s.by in where.eq:
        raise VecgptError(
            f"a grouped search of {s.collection!r} by {s.by!r} also filters {s.by!r} == {where.eq[s.by]}; "
            f"drop that equality or search without groups"
        )
    return where


def joined(s: Search, hits: Sequence[Hits]) -> Hits:
    """A grouped search's Hits [G, m, n] from each group's [m, n]; every group must have found as many rows."""
    if not hits:  # no groups
        m = np.shape(s.queries)[1] if np.ndim(s.queries) == 3 else 0
        return Hits(np.zeros((0, m, 0), np.int64), np.zeros((0, m, 0)))
    if s.radius is not None:  # ragged: each group's rows padded to the most any query found
        n = max(h.ids.shape[-1] for h in hits)
        return Hits(stacked([padded(h.ids, n, -1) for h in hits]), stacked([padded(h.dists, n, np.inf) for h in hits]))
    check_groups(s.collection, [h.ids.shape[-1] for h in hits])
    vectors = None if hits[0].vectors is None else stacked([h.vectors for h in hits])
    scored = None if any(h.scored is None for h in hits) else sum(h.scored for h in hits)
    return Hits(stacked([h.ids for h in hits]), stacked([h.dists for h in hits]), vectors, scored)


def check_radius(s: Search, shape: Sequence[int]) -> np.ndarray | None:
    """A radius search's radii, float64 of its queries' shape (shape: [m], or [G, m] grouped); None without one."""
    if s.radius is None:
        return None
    radius = np.asarray(s.radius, np.float64)
    if radius.shape != tuple(shape):
        raise VecgptError(
            f"a radius search of {s.collection!r} takes a radius per query, shape {tuple(shape)}, not {radius.shape}"
        )
    if np.isnan(radius).any():
        raise VecgptError(f"a radius search of {s.collection!r} has a radius that is NaN")
    if s.vectors or s.index is not None:
        raise VecgptError(f"a radius search of {s.collection!r} takes neither vectors nor an index")
    return radius


def ragged(found: Sequence[tuple[np.ndarray, np.ndarray]], k: int | None = None, shape: tuple = ()) -> Hits:
    """A radius search's Hits from each query's (ids, dists) in any order: nearest first (ties by id), at most k,
    padded to the most rows with id -1 and distance inf; shape: the queries' ([m] by default, [G, m] grouped)."""
    rows = []
    for ids, dists in found:
        order = np.lexsort((ids, dists))[:k]
        rows.append((np.asarray(ids, np.int64)[order], np.asarray(dists, np.float64)[order]))
    n = max((len(ids) for ids, _ in rows), default=0)
    ids = np.stack([padded(i, n, -1) for i, _ in rows]) if rows else np.zeros((0, 0), np.int64)
    dists = np.stack([padded(d, n, np.inf) for _, d in rows]) if rows else np.zeros((0, 0))
    shape = tuple(shape) or (len(rows),)
    return Hits(ids.reshape(*shape, n), dists.reshape(*shape, n))


def padded(a: np.ndarray, n: int, fill) -> np.ndarray:
    """a [..., n'] widened to [..., n] by `fill` after its own entries."""
    if a.shape[-1] == n:
        return a
    out = np.full((*a.shape[:-1], n), fill, a.dtype)
    out[..., : a.shape[-1]] = a
    return out


def by_query(which: np.ndarray, ids: np.ndarray, dists: np.ndarray, m: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Rows of m queries, row j query which[j] (0..m-1), as each query's (ids, dists): for `ragged`."""
    order = np.argsort(which, kind="stable")
    ends = np.searchsorted(which[order], np.arange(m + 1)).tolist()
    ids, dists = ids[order], dists[order]
    return [(ids[a:b], dists[a:b]) for a, b in zip(ends[:-1], ends[1:])]


def float32_at_most(r: float, distance=float, near: float | None = None) -> np.float32:
    """The largest float32 x whose distance(x) <= r, for a store that holds a distance as a float32 x and gives the
    protocol's distance(x) (non-decreasing; default x itself). A store comparing x < nextafter of it (or x <= it)
    keeps exactly the rows at distance <= r: where its threshold is a float32 and strict (FAISS, Milvus, LanceDB).
    near: an x about there (default r), from which it steps a float32 at a time."""
    start = r if near is None else near
    x = np.float32(min(max(start, -FLOAT32_MAX), FLOAT32_MAX)) if np.isfinite(start) else np.float32(start)
    down, up = np.float32(-np.inf), np.float32(np.inf)
    with np.errstate(over="ignore"):
        while np.isfinite(x) and distance(x) > r:
            x = np.nextafter(x, down)
        while x != up and distance(np.nextafter(x, up)) <= r:
            x = np.nextafter(x, up)
    return x


FLOAT32_MAX = float(np.finfo(np.float32).max)


def check_groups(name: str, counts: Sequence[int]) -> None:
    if len(set(counts)) > 1:
        advice = "; start the text again" if is_text(name) else ""  # a text's keys: lost by the store
        raise VecgptError(
            f"the groups of a search of {name!r} matched different numbers of rows ({min(counts)} to {max(counts)}): "
            f"rows are missing from some{advice}"
        )


_tally: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar("vecgpt_tally", default=None)


def record(requests: int = 1, subqueries: int = 0) -> None:
    """Adapters call this once per request they send, so the engine can count them by kind."""
    tally = _tally.get()
    if tally is not None:
        tally["requests"] += requests
        tally["subqueries"] += subqueries


class tally:
    """`with tally() as counts`: collect what `record` reports inside the block (and in `parallel` calls made from
    it). A class, not a generator: the engine opens one per store call, about 60 a token."""

    def __enter__(self) -> dict[str, int]:
        self.counts = {"requests": 0, "subqueries": 0}
        self.token = _tally.set(self.counts)
        return self.counts

    def __exit__(self, *exc) -> None:
        _tally.reset(self.token)


def parallel(calls: Sequence, workers: int = 16) -> list:
    """Run zero-argument callables concurrently, at most `workers` at a time, keeping the caller's tally; results in
    order. Every call has run when it returns or raises (the first failure, in order)."""
    if len(calls) <= 1:
        return [call() for call in calls]
    pool, futures, running = _pool(), [], set()
    try:
        for call in calls:
            if len(running) >= workers:
                running = wait(running, return_when=FIRST_COMPLETED).not_done
            futures.append(pool.submit(contextvars.copy_context().run, call))
            running.add(futures[-1])
        wait(running)
    except BaseException:  # Ctrl-C while waiting: the calls not started are dropped, those running end first
        for f in futures:
            f.cancel()
        wait(futures)
        raise
    return [f.result() for f in futures]


class InFlight:
    """The calls a store has running, by thread. A Ctrl-C ends the main thread's call at once, while the calls the
    writer thread or `parallel` runs go on in theirs; the store's close then waits for those before it shuts its
    client (closing a connection a call is using fails in both, SQLite's with a ThreadingViolationError)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.running: dict[int, int] = {}  # thread ident -> calls it has in flight (nested calls count again)
        self.closing = threading.Event()  # set while a close waits (tests wait for it)

    def __enter__(self) -> None:
        me = threading.get_ident()
        with self.cond:  # a call begun while a close shuts the client waits for it, then finds the store closed
            self.running[me] = self.running.get(me, 0) + 1

    def __exit__(self, *exc) -> None:
        me = threading.get_ident()
        with self.cond:
            self.running[me] -= 1
            if not self.running[me]:
                del self.running[me]
                self.cond.notify_all()

    def close(self, shut) -> None:
        """Wait until no other thread has a call in flight (this one's own are never waited for), then shut()."""
        me = threading.get_ident()
        with self.cond:
            self.closing.set()
            try:
                self.cond.wait_for(lambda: all(thread == me for thread in self.running))
                shut()
            finally:
                self.closing.clear()


STORE_CALLS = (
    *("create", "upsert", "search", "search_many", "fetch", "count", "drop", "collections", "stats", "clone"),
    *("read_manifest", "write_manifest", "manifests", "read_text", "write_text", "texts", "flush", "compact"),
)
_in_flight_lock = threading.Lock()


def in_flight(store) -> InFlight:
    """The store's calls in flight (made on first use)."""
    try:
        return store.__dict__["_in_flight"]
    except KeyError:
        with _in_flight_lock:
            return store.__dict__.setdefault("_in_flight", InFlight())


def closes_after_calls(cls: type[T]) -> type[T]:
    """A store class whose close() waits for its calls in flight in other threads: every method of STORE_CALLS it
    has is counted while it runs (`InFlight`)."""
    for name in STORE_CALLS:
        method = getattr(cls, name, None)
        if method is not None:
            setattr(cls, name, _counted(method))
    shut = cls.close

    @functools.wraps(shut)
    def close(self) -> None:
        in_flight(self).close(lambda: shut(self))

    close.waits_for_calls = True
    cls.close = close
    return cls


def _counted(method):
    @functools.wraps(method)
    def counted(self, *args, **kwargs):
        with in_flight(self):
            return method(self, *args, **kwargs)

    return counted


# Threads kept for `parallel` (so a round's requests do not each pay a thread start and a join): one pool for each
# depth of parallel() calls inside parallel() calls, so a pool's calls never wait for a thread of their own pool.
POOL_THREADS = 256
_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock, _depth = threading.Lock(), threading.local()


def _forget_pools() -> None:  # a forked child has none of the threads, and maybe a lock held by one
    global _pools_lock
    _pools.clear()
    _pools_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_pools)


def _pool() -> ThreadPoolExecutor:
    depth = getattr(_depth, "n", 0)
    with _pools_lock:
        if depth not in _pools:
            _pools[depth] = ThreadPoolExecutor(
                POOL_THREADS, f"vecgpt-parallel-{depth}", initializer=setattr, initargs=(_depth, "n", depth + 1)
            )
        return _pools[depth]


RETRY_DELAY_S, MAX_RETRY_DELAY_S = 0.25, 8.0  # the turbopuffer client's backoff, used by pgvector too


def retry_delay(attempt: int) -> float:
    """Seconds to wait before retry number attempt + 1 (0.25, 0.5, 1, ... up to 8)."""
    return min(RETRY_DELAY_S * 2**attempt, MAX_RETRY_DELAY_S)


def worst_case_s(timeout: float, max_retries: int) -> float:
    """The longest a failing request takes to give up: every try waits up to `timeout`, with backoff between."""
    return (max_retries + 1) * timeout + sum(retry_delay(n) for n in range(max_retries))


def cache_dir(name: str) -> Path:
    """$XDG_CACHE_HOME/vecgpt/<name> (~/.cache when unset): where a store keeps its files unless told."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vecgpt" / name


def folder_lock(folder):
    """An exclusive lock on a store folder, held across processes (flock): one load at a time."""
    return file_lock(Path(folder) / ".load.lock")


@contextmanager
def file_lock(path: Path, wait: bool = True, busy: Exception | None = None):
    """An exclusive flock on a file, held across processes; released when the holder exits, even by kill -9.
    wait=False: raise `busy` at once if another holds it."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise busy from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def write_json(path: Path, value, indent: int | None = 1) -> None:
    """Write beside the file, then rename over it: a reader sees the old file or the new, never half of one."""
    tmp = path.with_suffix(".part")
    tmp.write_text(json.dumps(value, indent=indent))
    tmp.replace(path)


def first_line(error: BaseException) -> str:
    """An exception's message, its first line (its type's name if it has none)."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


# The checks every adapter makes, in the same words for every store.
def check_metric(backend: str, metric: Metric, offered: Sequence[Metric]) -> None:
    if metric not in offered:
        raise VecgptError(
            f"{backend} cannot rank by {metric!r}; it offers {' and '.join(map(repr, offered))} (metric in the config)"
        )


def check_same(name: str, held: tuple, dim: int, metric: Metric, payload: int | None = None) -> None:
    """Creating a collection that exists: a no-op with the same dimension and metric, and the same payload width
    where `held` (dim, metric[, payload]) gives one, else an error."""
    if tuple(held[:2]) != (dim, metric):
        raise VecgptError(
            f"collection {name!r} exists with dimension {held[0]} and metric {held[1]}, "
            f"not {dim} and {metric}; drop it first"
        )
    if payload is not None and len(held) > 2 and held[2] != payload:
        raise VecgptError(f"collection {name!r} exists with payload width {held[2]}, not {payload}; drop it first")


def check_vectors(name: str, vectors: np.ndarray, dim: int) -> np.ndarray:
    vectors = np.asarray(vectors, np.float32)
    if vectors.ndim != 2 or vectors.shape[1] != dim:
        raise VecgptError(f"collection {name!r} holds vectors of dimension {dim}, got shape {vectors.shape}")
    return vectors


def check_grouped(name: str, queries: np.ndarray, dim: int) -> np.ndarray:
    """A grouped search's queries (Search.by), float32 [groups, m, dim]."""
    queries = np.asarray(queries, np.float32)
    if queries.ndim != 3 or queries.shape[2] != dim:
        raise VecgptError(f"a grouped search of {name!r} takes queries [groups, m, {dim}], got shape {queries.shape}")
    return queries


def check_rows(name: str, ids: np.ndarray, vectors: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """An upsert's ids (int64) and vectors (float32 [n, dim]), one id per vector."""
    vectors, ids = check_vectors(name, vectors, dim), np.asarray(ids, np.int64)
    if len(ids) != len(vectors):
        raise VecgptError(f"upsert into {name!r}: {len(ids)} ids for {len(vectors)} vectors")
    return ids, vectors


def check_payload(name: str, payload, n: int, width: int) -> np.ndarray:
    """An upsert's payload as float32 [n, width] (zeros when not given)."""
    if payload is None:
        return np.zeros((n, width), np.float32)
    payload = np.asarray(payload, np.float32)
    if payload.shape != (n, width):
        raise VecgptError(f"upsert into {name!r}: payload of shape {payload.shape}, expected ({n}, {width})")
    return payload


def check_version(text_id: str, held: int | None, expect: int | None) -> int:
    """The version a conditional write of a text record sets, or TextConflict if `held` is not `expect`."""
    if held == expect:
        return (expect or 0) + 1
    if expect is None:
        raise TextConflict(f"text {text_id} exists already")
    if held is None:
        raise TextConflict(f"text {text_id} was removed by another process")
    raise TextConflict(f"text {text_id} was changed by another process (version {held}, not {expect}); open it again")


def text_busy(text_id: str) -> VecgptError:
    return VecgptError(f"text {text_id} is open in another process; close it there (or wait for it to finish)")


def last_writes(
    name: str, ids: np.ndarray, vectors: np.ndarray, attrs: Mapping[str, np.ndarray], columns: Sequence[str]
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """One row per id, the last written where an upsert repeats it, sorted by id; an attribute not given is 0."""
    unknown = set(attrs) - set(columns)
    if unknown:
        raise VecgptError(f"upsert into {name!r}: unknown attribute {sorted(unknown)[0]!r}; it has {list(columns)}")
    ids = np.asarray(ids, np.int64)
    if not ascending(ids):  # else distinct and sorted already (a text's keys of a step): kept as given
        ids, last = np.unique(ids[::-1], return_index=True)
        last = len(vectors) - 1 - last
        vectors, attrs = vectors[last], {a: np.asarray(column)[last] for a, column in attrs.items()}
    return (
        ids,
        vectors,
        {a: np.asarray(attrs[a], np.int64) if a in attrs else np.zeros(len(ids), np.int64) for a in columns},
    )


def ascending(ids: np.ndarray) -> bool:
    """Whether ids rise strictly: each once, in order."""
    return len(ids) < 2 or bool((ids[1:] > ids[:-1]).all())


def check_where(name: str, where: Where | None, attrs: Sequence[str]) -> None:
    check_attributes(name, set() if where is None else where.attributes(), attrs)


def check_attributes(name: str, filtered: set[str], attrs: Sequence[str]) -> None:
    """Filters name only attributes the collection has."""
    unknown = filtered - set(attrs)
    if unknown:
        raise VecgptError(
            f"filter on unknown attribute {sorted(unknown)[0]!r}; collection {name!r} has {sorted(attrs)}"
        )


def positions(name: str, found: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Where each wanted id is among the ids found (any order); an error naming the first one missing."""
    if len(found) == 0:
        check_found(name, want[:1], ())
        return np.zeros(0, np.intp)
    order = np.argsort(found)
    at = order[np.searchsorted(found, want, sorter=order).clip(0, len(found) - 1)]
    check_found(name, want[found[at] != want][:1], ())
    return at


def check_found(name: str, ids: np.ndarray, found: abc.Container) -> None:
    """A fetch found every id it asked for (found: the ids the store returned)."""
    missing = [int(i) for i in ids if int(i) not in found]
    if missing:
        raise VecgptError(f"collection {name!r} has no id {missing[0]}")


def no_collection(store: object, name: str) -> VecgptError:
    return VecgptError(f"{store} has no collection {name!r}")


def existing(found: T | None, store: object, name: str) -> T:
    """What the store found for a collection, or the error that it has none of that name."""
    if found is None:
        raise no_collection(store, name)
    return found


class FolderStore:
    """What stores kept in one folder share: the folder, its manifests/<key>.json, the load lock, damage reports."""

    backend: str  # the store's name, and its folder's under the cache folder by default

    def __init__(self, path: str | None = None):
        self.path = expand(path) if path else cache_dir(self.backend)

    def __str__(self) -> str:
        return f"{type(self).__name__}(path={self.path})"

    local = True  # reading a manifest costs no request: a text checks its model is still there before each read

    def _manifest_path(self, key: str) -> Path:
        return self.path / "manifests" / f"{key}.json"

    def read_manifest(self, key: str) -> dict | None:
        path = self._manifest_path(key)
        if not path.is_file():
            return None
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise self.damaged(f"manifests/{key}.json is damaged", e) from None
        if not isinstance(manifest, dict):
            raise self.damaged(f"manifests/{key}.json is damaged", ValueError("not a JSON object"))
        return manifest

    def write_manifest(self, key: str, manifest: dict | None) -> None:
        self.flush()  # the manifest marks a load complete: everything before it is on disk
        path = self._manifest_path(key)
        if manifest is None:
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, manifest)

    def manifests(self) -> list[str]:
        folder = self.path / "manifests"
        return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []

    # text records: texts/<id>.json, replaced by rename under an flock of texts/<id>.lock
    def read_text(self, text_id: str) -> dict | None:
        path = self.path / "texts" / f"{text_id}.json"
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise self.damaged(f"texts/{text_id}.json is damaged", e) from None

    def write_text(self, text_id: str, record: dict | None, expect: int | None) -> int:
        path = self.path / "texts" / f"{text_id}.json"
        with file_lock(path.with_suffix(".lock")):
            held = self.read_text(text_id)
            version = check_version(text_id, None if held is None else held.get("version"), expect)
            if record is None:
                path.unlink()
                path.with_suffix(".lock").unlink(missing_ok=True)
            else:
                write_json(path, {**record, "version": version}, indent=None)  # written every token: compact
        return version

    def texts(self) -> list[str]:
        folder = self.path / "texts"
        return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []

    @contextmanager
    def text_lock(self, text_id: str):
        with file_lock(self.path / "texts" / f"{text_id}.open", wait=False, busy=text_busy(text_id)):
            yield

    def flush(self) -> None:
        """Write to disk what is held only in memory."""

    def load_lock(self):
        return folder_lock(self.path)

    def damaged(self, what: str, error: BaseException) -> VecgptError:
        return VecgptError(
            f"{self.backend} store at {self.path}: {what} ({type(error).__name__}: {first_line(error)[:200]}); "
            f"remove {self.path} and run `vecgpt load` again"
        )


@functools.cache
def in_tree() -> tuple[str, ...]:
    """The modules and packages of vecgpt/backends that define connect() at top level (read, not imported)."""
    import vecgpt.backends as pkg

    return tuple(
        sorted(
            m.name
            for m in pkgutil.iter_modules(pkg.__path__)
            if not m.name.startswith("_") and _defines_connect(m.module_finder.path, m.name)
        )
    )


def _defines_connect(folder: str, name: str) -> bool:
    """<name>.py, or a package <name>/ whose __init__.py, defines connect()."""
    package = Path(folder) / name / "__init__.py"
    tree = ast.parse((package if package.is_file() else Path(folder) / f"{name}.py").read_text(encoding="utf-8"))
    return any(isinstance(node, ast.FunctionDef) and node.name == "connect" for node in tree.body)


def installed() -> dict[str, metadata.EntryPoint]:
    """Stores other packages declare in the entry point group vecgpt.stores, by name."""
    return {ep.name: ep for ep in metadata.entry_points(group=GROUP)}


def available() -> list[str]:
    return sorted(set(in_tree()) | set(installed()))


def connector(backend: str):
    """The backend's connect(); a missing client library is one line saying what to install."""
    if backend in in_tree():
        try:
            return importlib.import_module(f"vecgpt.backends.{backend}").connect
        except ImportError as e:
            raise VecgptError(f"backend {backend!r} needs {e.name}: pip install 'vecgpt[{backend}]'") from None
    ep = installed()[backend]
    try:
        return ep.load()
    except ImportError as e:
        raise VecgptError(f"backend {backend!r} (entry point {ep.value}) needs {e.name}; pip install it") from None


def extra(backend: str, name: str):
    """An optional function the backend's module offers beside connect() (e.g. estimate_cost), or None."""
    return getattr(importlib.import_module(connector(backend).__module__), name, None)


def one_process(backend: str, options: dict) -> bool:
    """Whether only one process at a time may open the store these options name (an embedded engine that locks its
    file: DuckDB, Milvus Lite): the backend module's ONE_PROCESS, a bool or a function of the [store] options. A
    second process gets a one-line error saying so; tests that open a store from two processes ask this first."""
    said = extra(backend, "ONE_PROCESS")
    return bool(said(**options) if callable(said) else said)


LOCATIONS = ("path", "schema", "prefix")  # what a store's connect() may call where it keeps its data


def location_key(backend: str) -> str:
    """The [store] option saying where this backend keeps its data (`--store` sets it): the first of LOCATIONS
    its connect() takes."""
    if backend not in available():
        raise VecgptError(f"unknown backend {backend!r}; known backends: {', '.join(available())}")
    accepted = inspect.signature(connector(backend)).parameters
    found = next((name for name in LOCATIONS if name in accepted), None)
    if found is None:
        raise VecgptError(f"backend {backend!r} takes no location ({', '.join(LOCATIONS)}); drop --store")
    return found


def user_name() -> str:
    """This user's name as identifiers allow it ([a-z0-9_]): what per-user defaults are named from."""
    import getpass

    try:
        name = getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (a bare container)
        name = f"uid{os.getuid()}"
    return re.sub(r"[^a-z0-9_]", "_", name.lower()) or f"uid{os.getuid()}"


def get_store(backend: str, **options) -> Store:
    """Find the backend's connect() (in tree, else by entry point) and call it with the [store] options."""
    if backend not in available():
        raise VecgptError(f"unknown backend {backend!r}; known backends: {', '.join(available())}")
    connect = connector(backend)
    accepted = inspect.signature(connect).parameters
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise VecgptError(
            f"backend {backend!r} takes no option {unknown[0]!r} in [store]; "
            f"it takes: {', '.join(accepted) or 'nothing'}"
        )
    hints = typing.get_type_hints(connect)
    for name, value in options.items():
        check_option(name, value, hints.get(name, object))
    return connect(**options)


def check_option(name: str, value, expected) -> None:
    """A [store] option of the type connect() declares; numbers (counts, sizes, seconds) not negative."""
    if not conforms(value, expected):
        wanted = " or ".join(getattr(t, "__name__", str(t)) for t in typing.get_args(expected) or [expected])
        raise VecgptError(
            f"[store] {name} = {value!r} has the wrong type (expected {wanted.replace('NoneType', 'unset')})"
        )
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not value >= 0:  # NaN too
        raise VecgptError(f"[store] {name} must be 0 or more, not {value}")
    if isinstance(value, str) and "\x00" in value:
        raise VecgptError(f"[store] {name} must not contain a NUL character")


def conforms(value, expected) -> bool:
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, t) for t in args)
    if origin is not None and issubclass(origin, abc.Sequence):  # Sequence[str]: a TOML array of strings
        return isinstance(value, (list, tuple)) and all(conforms(v, args[0]) for v in value)
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return expected is object or isinstance(value, expected)
