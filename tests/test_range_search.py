"""Radius searches (Search.radius) on every store: each query's rows at a distance <= its radius, as an independent
numpy computation finds them, in the store's own arithmetic (each row's distance what its plain search gives it).

Hits of a radius search are ragged: each query's rows nearest first, padded with id -1 and distance inf to the most
any query found. Radii lie between two rows' true distances whose gap is far wider than the store's rounding, so
no near-tie decides a test; a row exactly at the radius is tested with integer vectors, whose distances every store
computes exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from vecgpt import tolerance
from vecgpt.backends.base import Hits, Search, Where, tally
from vecgpt.encoding import distance_bound
from vecgpt.errors import VecgptError
from vecgpt.meter import Call, bound

DIM, N = 12, 240
WHERE = Where(eq={"layer": 1}, lt={"position": 30})
FEWER = {"pgvector", "sqlite", "duckdb"}  # several texts' searches in one statement
# A request's queries scored as one product, so a query's bits depend on those sent with it (tests/test_batch.py's
# RULE): Milvus's range search sends a request a radius, its plain search one for them all.
ONE_PRODUCT = {"milvus"}


def fill(store, metric: str, name: str = "c", n: int = N, integers: bool = False, seed: int = 0) -> np.ndarray:
    """Rows i with id 7i + 5, layer i % 2, head (i // 2) % 3, position i // 6; vectors random (or small integers)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-2, 3, (n, DIM)) if integers else rng.standard_normal((n, DIM))
    x = x.astype(np.float32)
    i = np.arange(n)
    store.create(name, DIM, metric, attrs=("layer", "head", "position"))
    store.upsert(name, i * 7 + 5, x, {"layer": i % 2, "head": (i // 2) % 3, "position": i // 6})
    return x


def attributes(n: int = N) -> dict[str, np.ndarray]:
    i = np.arange(n)
    return {"layer": i % 2, "head": (i // 2) % 3, "position": i // 6}


def truth(q: np.ndarray, x: np.ndarray, metric: str) -> np.ndarray:
    q, x = q.astype(np.float64), x.astype(np.float64)
    return ((q[:, None] - x[None]) ** 2).sum(-1) if metric == "l2" else -(q @ x.T)


def margin(q: np.ndarray, x: np.ndarray, metric: str, backend: str) -> float:
    """Far more than any store's error on these distances (LanceDB's 1 - x.y rounds once more, near 1)."""
    qn, xn = np.linalg.norm(q.astype(np.float64), axis=1), np.linalg.norm(x.astype(np.float64), axis=1)
    worst = distance_bound(qn.max(), xn.max(), DIM, metric, tolerance.unit_roundoff(backend))
    return 8 * worst + 1e-5 * (1 + float(np.abs(truth(q, x, metric)).max()))


def radius_between(t: np.ndarray, want: int, gap: float) -> float:
    """A radius keeping about `want` of the distances t: between two sorted neighbours more than 2 gap apart."""
    t = np.sort(t)
    for c in sorted(range(len(t) + 1), key=lambda c: abs(c - want)):
        if c == 0:
            return float(t[0] - 2 * gap) if len(t) else 0.0
        if c == len(t) or t[c] - t[c - 1] > 2 * gap:
            return float(t[c - 1] + gap) if c == len(t) else float((t[c - 1] + t[c]) / 2)
    raise AssertionError("no gap")


def searched(store, searches: list[Search]) -> list[Hits]:
    """As the engine sends them: grouped searches apart to a store that cannot take them."""
    return bound(store, Call("search_many", (searches,), {}))()


def check_ragged(hits: Hits, want: list[set], ids_of_rows, t: np.ndarray, gap: float, width: int | None = None):
    """Each query's rows are the wanted ones, nearest first by the store's distances, near their true distances,
    then padding (id -1, distance inf) to the longest (width: to that, a grouped search's longest)."""
    width = max((len(w) for w in want), default=0) if width is None else width
    assert hits.ids.shape == hits.dists.shape == (len(want), width)
    assert hits.ids.dtype == np.int64
    for row, wanted in enumerate(want):
        n = len(wanted)
        assert set(hits.ids[row, :n].tolist()) == wanted
        assert np.all(hits.ids[row, n:] == -1) and np.all(np.isinf(hits.dists[row, n:]))
        assert np.all(np.diff(hits.dists[row, :n]) >= 0)
        at = np.searchsorted(ids_of_rows, hits.ids[row, :n])
        assert np.all(np.abs(hits.dists[row, :n] - t[row, at]) <= gap)


def same_as_plain(store, backend: str, s: Search, hits: Hits, gap: float) -> None:
    """Each row's distance is the one the store's plain search of the same rows gives it: bit for bit, but where a
    query's bits depend on the others of its request (then within the margin)."""
    plain = store.search(s.collection, s.queries, None, s.where)
    for row in range(len(s.queries)):
        given = dict(zip(plain.ids[row].tolist(), plain.dists[row].tolist()))
        kept = hits.ids[row] >= 0
        want = np.array([given[i] for i in hits.ids[row][kept].tolist()])
        if backend in ONE_PRODUCT:
            assert np.all(np.abs(want - hits.dists[row][kept]) <= gap)
        else:
            assert want.tolist() == hits.dists[row][kept].tolist()


@pytest.fixture(params=["l2", "ip"])
def metric(request, make_store, backend):
    if request.param not in make_store(backend).metrics:
        pytest.skip(f"{backend} does not rank by {request.param}")
    return request.param


def test_each_query_gets_the_rows_within_its_radius(make_store, backend, metric):
    store = make_store(backend)
    x = fill(store, metric)
    q = np.random.default_rng(1).standard_normal((4, DIM)).astype(np.float32)
    keep = WHERE.mask(attributes(), N)
    rows, t, gap = np.flatnonzero(keep), truth(q, x, metric), margin(q, x, metric, backend)
    radius = np.array([radius_between(t[i, keep], w, gap) for i, w in enumerate([3, 0, 17, 90])])
    s = Search("c", q, where=WHERE, radius=radius)
    (hits,) = store.search_many([s])
    want = [set((rows[t[i, keep] <= radius[i]] * 7 + 5).tolist()) for i in range(4)]
    assert not want[1] and len(want[3]) == keep.sum()  # one query keeps nothing, one every row
    check_ragged(hits, want, np.arange(N) * 7 + 5, t, gap)
    same_as_plain(store, backend, s, hits, gap)


def test_a_radius_search_without_a_filter(make_store, backend, metric):
    store = make_store(backend)
    x = fill(store, metric)
    q = np.random.default_rng(2).standard_normal((2, DIM)).astype(np.float32)
    t, gap = truth(q, x, metric), margin(q, x, metric, backend)
    radius = np.array([radius_between(t[0], 5, gap), radius_between(t[1], 40, gap)])
    (hits,) = store.search_many([Search("c", q, radius=radius)])
    want = [set((np.flatnonzero(t[i] <= radius[i]) * 7 + 5).tolist()) for i in range(2)]
    check_ragged(hits, want, np.arange(N) * 7 + 5, t, gap)


def test_k_keeps_the_nearest_within_the_radius(make_store, backend, metric):
    store = make_store(backend)
    x = fill(store, metric)
    q = np.random.default_rng(3).standard_normal((3, DIM)).astype(np.float32)
    keep = WHERE.mask(attributes(), N)
    rows, t, gap = np.flatnonzero(keep), truth(q, x, metric)[:, keep], margin(q, x, metric, backend)
    radius = np.array([radius_between(t[0], 30, gap), radius_between(t[1], 2, gap), radius_between(t[2], 0, gap)])
    k = next(k for k in range(5, 30) if all(np.diff(np.sort(t[i])[k - 1 : k + 1])[0] > 2 * gap for i in range(3)))
    (hits,) = store.search_many([Search("c", q, k, WHERE, radius=radius)])
    want = []
    for i in range(3):
        order = np.argsort(t[i])
        within = order[t[i][order] <= radius[i]][:k]
        want.append(set((rows[within] * 7 + 5).tolist()))
    assert [len(w) for w in want] == [k, 2, 0]
    check_ragged(hits, want, rows * 7 + 5, t, gap)


def test_a_radius_that_keeps_nothing(make_store, backend, metric):
    store = make_store(backend)
    x = fill(store, metric)
    q = np.random.default_rng(4).standard_normal((2, DIM)).astype(np.float32)
    t = truth(q, x, metric)
    radius = t.min(axis=1) - 1.0
    for k in (None, 4):
        (hits,) = store.search_many([Search("c", q, k, WHERE, radius=radius)])
        assert hits.ids.shape == hits.dists.shape == (2, 0)
    grouped = Search("c", np.stack([q, q, q]), None, WHERE, by="head", radius=np.stack([radius] * 3))
    (hits,) = searched(store, [grouped])
    assert hits.ids.shape == (3, 2, 0)


def test_a_row_exactly_at_the_radius_is_kept(make_store, backend, metric):
    """Integer vectors: every store's distances are exact, and a radius equal to a row's distance keeps that row
    (l2: a perfect square, which a store giving the L2 distance takes the root of exactly)."""
    store = make_store(backend)
    x = fill(store, metric, integers=True)
    q = x[[3, 8]].copy()
    q[:, 0] += 2  # row 3 lies at l2 distance 4 from query 0, row 8 at 4 from query 1
    t = truth(q, x, metric)
    radius = np.array([4.0, 4.0]) if metric == "l2" else np.array([t[0, 3], t[1, 8]])
    (hits,) = store.search_many([Search("c", q, radius=radius)])
    want = [set((np.flatnonzero(t[i] <= radius[i]) * 7 + 5).tolist()) for i in range(2)]
    assert 3 * 7 + 5 in want[0] and 8 * 7 + 5 in want[1]
    assert any((t[i] > radius[i]).any() for i in range(2))
    check_ragged(hits, want, np.arange(N) * 7 + 5, t, 0.0)
    assert [set(row[row >= 0].tolist()) for row in hits.ids] == want
    for i in range(2):
        assert np.array_equal(hits.dists[i][hits.ids[i] >= 0], np.sort(t[i][t[i] <= radius[i]]))


def test_a_grouped_radius_search(make_store, backend, metric):
    """Search.by with a radius per group and query ([G, m]): group g's rows are those of head g, each query's
    within its own radius; the groups padded to the most any query found."""
    store = make_store(backend)
    x = fill(store, metric)
    q = np.random.default_rng(5).standard_normal((3, 2, DIM)).astype(np.float32)
    attrs = attributes()
    gap = margin(q.reshape(-1, DIM), x, metric, backend)
    radius, want, t = np.zeros((3, 2)), [], np.zeros((3, 2, N))
    for g in range(3):
        keep = WHERE.mask(attrs, N) & (attrs["head"] == g)
        t[g] = truth(q[g], x, metric)
        radius[g] = [radius_between(t[g, i, keep], [4, 11, 0, 7, 2, 25][2 * g + i], gap) for i in range(2)]
        want.append([set((np.flatnonzero(keep & (t[g, i] <= radius[g, i])) * 7 + 5).tolist()) for i in range(2)])
    (hits,) = searched(store, [Search("c", q, None, WHERE, by="head", radius=radius)])
    n = max(len(w) for ws in want for w in ws)
    assert hits.ids.shape == hits.dists.shape == (3, 2, n)
    for g in range(3):
        check_ragged(Hits(hits.ids[g], hits.dists[g]), want[g], np.arange(N) * 7 + 5, t[g], gap, n)


def test_texts_radius_searches_together_are_each_alone(make_store, backend):
    """Several texts' grouped radius searches in one search_many (as the engine sends a step's key searches): each
    text's hits bit for bit its search alone, in one statement where the store joins texts."""
    store, rng = make_store(backend), np.random.default_rng(6)
    searches = []
    for j in range(4):
        n, where = 60 + 30 * j, Where(eq={"layer": 0}, lt={"position": 8 + 2 * j})
        x = fill(store, "l2", f"text-{j}", n=n, seed=10 + j)
        q = rng.standard_normal((3, 1 + j % 2, DIM)).astype(np.float32)
        attrs, gap = attributes(n), margin(q.reshape(-1, DIM), x, "l2", backend)
        radius = np.zeros(q.shape[:2])
        for g in range(3):
            keep = where.mask(attrs, n) & (attrs["head"] == g)
            t = truth(q[g], x, "l2")[:, keep]
            radius[g] = [radius_between(t[i], 2 + j + i, gap) for i in range(len(q[g]))]
        searches.append(Search(f"text-{j}", q, None, where, by="head", radius=radius))
    with tally() as together:
        found = searched(store, searches)
    for s, got in zip(searches, found):
        with tally() as alone:
            (one,) = searched(store, [s])
        assert np.array_equal(got.ids, one.ids) and np.array_equal(got.dists, one.dists)
        assert got.ids.shape[:2] == s.queries.shape[:2]
    if backend in FEWER:
        assert together["requests"] == 1 == alone["requests"]


def test_a_bad_radius_is_refused(make_store, backend):
    store = make_store(backend)
    fill(store, "l2" if "l2" in store.metrics else "ip")
    q = np.zeros((2, DIM), np.float32)
    for bad, words in [
        (Search("c", q, radius=np.ones(3)), "a radius per query"),
        (Search("c", q, radius=np.array([1.0, np.nan])), "NaN"),
        (Search("c", q, radius=np.ones(2), vectors=True), "neither vectors"),
        (Search("c", q[None], by="head", radius=np.ones(2)), "a radius per query"),
    ]:
        with pytest.raises(VecgptError, match=words):
            searched(store, [bad])


@pytest.mark.parametrize("keeps", [3, 30, 85])
def test_turbopuffer_pages_until_a_row_lies_beyond_the_radius(make_store, keeps):
    """turbopuffer has no range query: a radius search asks for the nearest rows, then twice as many while all of
    them lie within the radius; past max_top_k (50 here) it splits by id ranges as any search. One request when the
    first page (8 rows) already reaches beyond the radius, more when it was full."""
    store = make_store("turbopuffer", max_top_k=50)
    store.first_page = 8
    x = fill(store, "l2")
    q = np.random.default_rng(7).standard_normal((1, DIM)).astype(np.float32)
    keep = WHERE.mask(attributes(), N)
    t, gap = truth(q, x, "l2"), margin(q, x, "l2", "turbopuffer")
    radius = np.array([radius_between(t[0, keep], keeps, gap)])
    with tally() as counts:
        (hits,) = store.search_many([Search("c", q, where=WHERE, radius=radius)])
    want = [set((np.flatnonzero(keep & (t[0] <= radius[0])) * 7 + 5).tolist())]
    assert len(want[0]) == keeps
    check_ragged(hits, want, np.arange(N) * 7 + 5, t, gap)
    assert counts["requests"] == 1 if keeps < 8 else counts["requests"] > 1
    (top,) = store.search_many([Search("c", q, 12, WHERE, radius=radius)])  # k: pages stop at k rows
    assert top.ids[0][top.ids[0] >= 0].tolist() == hits.ids[0][:12][hits.ids[0][:12] >= 0].tolist()
