"""Conformance: every registered backend must pass these (run against the real library or server)."""

import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from vecgpt import tolerance
from vecgpt.backends.base import Search, Where, apart, in_flight
from vecgpt.encoding import distance_bound
from vecgpt.errors import VecgptError
from vecgpt.meter import Metered
from vecgpt.sampling import Candidates

rng = np.random.default_rng(0)


def true_dists(q, x, metric):  # float64 truth from the float32 vectors
    q, x = q.astype(np.float64), x.astype(np.float64)
    return ((q[:, None, :] - x[None]) ** 2).sum(-1) if metric == "l2" else -(q @ x.T)


def dist_bound(q, x, metric, backend):  # [m, n]: the derived bound on each returned distance
    qn, xn = np.linalg.norm(q.astype(np.float64), axis=1), np.linalg.norm(x.astype(np.float64), axis=1)
    return distance_bound(qn[:, None], xn[None], q.shape[1], metric, tolerance.unit_roundoff(backend))


def filled(store, name="c", n=300, dim=24, metric="l2"):
    x = rng.standard_normal((n, dim)).astype(np.float32)
    store.create(name, dim, metric, attrs=("layer", "head", "position"))
    attrs = {"layer": np.arange(n) % 3, "head": (np.arange(n) // 3) % 4, "position": np.arange(n) // 12}
    store.upsert(name, np.arange(n) * 7 + 5, x, attrs)  # ids need not be 0..n-1
    return x, attrs


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_search_returns_every_row_with_true_distance(make_store, backend, metric):
    store = make_store(backend)
    if metric not in store.metrics:
        pytest.skip(f"{backend} does not rank by {metric}")
    x, _ = filled(store, metric=metric)
    q = rng.standard_normal((3, 24)).astype(np.float32)
    hits = store.search("c", q)
    assert hits.ids.shape == (3, 300)
    truth = true_dists(q, x, metric)
    for row in range(3):
        order = np.argsort(hits.ids[row])
        assert np.array_equal(hits.ids[row][order], np.arange(300) * 7 + 5)
        assert np.all(np.abs(hits.dists[row][order] - truth[row]) <= dist_bound(q, x, metric, backend)[row])


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_top_k_is_nearest_first(make_store, backend, metric):
    store = make_store(backend)
    if metric not in store.metrics:
        pytest.skip(f"{backend} does not rank by {metric}")
    x, _ = filled(store, metric=metric)
    q = rng.standard_normal((2, 24)).astype(np.float32)
    hits = store.search("c", q, k=10)
    truth, bound = true_dists(q, x, metric), dist_bound(q, x, metric, backend)
    for row in range(2):  # the ranking rule of vecgpt.tolerance on -distance, by document
        found = Candidates((hits.ids[row] - 5) // 7, -hits.dists[row].astype(np.float64))
        assert not tolerance.disagreements(found, -truth[row], 10, bound[row].max())
        assert np.all(np.diff(hits.dists[row]) >= 0)  # nearest first, by the store's own distances


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_one_query_over_a_big_collection(make_store, backend, metric):
    """A decode step's shape: one query over more rows than one thread scans (FAISS splits them)."""
    store = make_store(backend)
    if metric not in store.metrics:
        pytest.skip(f"{backend} does not rank by {metric}")
    x, _ = filled(store, n=3001, dim=200, metric=metric)
    q = rng.standard_normal((1, 200)).astype(np.float32)
    truth, bound = true_dists(q, x, metric)[0], dist_bound(q, x, metric, backend)[0]
    hits = store.search("c", q)
    order = np.argsort(hits.ids[0])
    assert np.array_equal(hits.ids[0][order], np.arange(3001) * 7 + 5)
    assert np.all(np.abs(hits.dists[0][order] - truth) <= bound)
    top = store.search("c", q, k=25)
    found = Candidates((top.ids[0] - 5) // 7, -top.dists[0].astype(np.float64))
    assert not tolerance.disagreements(found, -truth, 25, bound.max())
    assert np.all(np.diff(top.dists[0]) >= 0)


def test_filters_exclude_what_they_must(make_store, backend):
    store = make_store(backend)
    x, attrs = filled(store)
    q = rng.standard_normal((2, 24)).astype(np.float32)
    cases = [
        Where(eq={"layer": 1, "head": 2}, lt={"position": 9}),
        Where(ge={"position": 20}),
        Where(eq={"layer": 0}, lt={"position": 5}, ge={"position": 2}),
        Where(eq={"layer": 2, "head": 3}, lt={"position": 0}),
    ]
    for where in cases:
        keep = where.mask(attrs, 300)
        hits = store.search("c", q, where=where)
        assert hits.ids.shape == (2, keep.sum())
        for row in range(2):
            assert set(hits.ids[row].tolist()) == set((np.flatnonzero(keep) * 7 + 5).tolist())
        top = store.search("c", q, k=3, where=where)
        assert set(top.ids[0].tolist()) <= set((np.flatnonzero(keep) * 7 + 5).tolist())


@pytest.mark.parametrize("n", [300, 3000])
@pytest.mark.parametrize("shared", [False, True])  # True: a layer's heads (layer and a position range in common)
@pytest.mark.parametrize("top", [False, True])  # True: a top-k search among them (in-process stores: each alone)
def test_search_many_matches_single_searches(make_store, backend, n, shared, top):
    store = make_store(backend)
    filled(store, n=n)
    q = rng.standard_normal((2, 24)).astype(np.float32)
    wheres = [
        Where(eq={"layer": 1, "head": h}, lt={"position": n // 24}) if shared else Where(eq={"layer": h % 3, "head": h})
        for h in range(4)
    ]
    searches = [Search("c", q, where=w) for w in wheres] + ([Search("c", q, k=5)] if top else [])
    for many, s in zip(store.search_many(searches), searches):
        one = store.search(s.collection, s.queries, s.k, s.where)
        if s.k is None:
            assert many.ids.shape[1] == one.ids.shape[1] > 0
            for row in range(len(q)):  # the same rows at the same distances, in whatever order the store gives
                a, b = np.argsort(many.ids[row]), np.argsort(one.ids[row])
                assert many.ids[row][a].tolist() == one.ids[row][b].tolist()
                np.testing.assert_allclose(many.dists[row][a], one.dists[row][b], rtol=1e-6, atol=1e-5)
        else:
            assert many.ids.tolist() == one.ids.tolist()


@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("n", [300, 3000])
def test_a_search_asked_for_vectors_gives_each_rows_stored_vector(make_store, backend, metric, n):
    """Search(vectors=True): the same rows and distances as without, each row with its stored vector, bit for bit
    (the token search's, so the next token's embedding needs no fetch); searches beside it are unchanged."""
    store = make_store(backend)
    if metric not in store.metrics:
        pytest.skip(f"{backend} does not rank by {metric}")
    x, _ = filled(store, n=n, metric=metric)
    q = rng.standard_normal((2, 24)).astype(np.float32)
    shapes = [dict(k=7), dict(k=5, where=Where(eq={"layer": 2})), dict(), dict(where=Where(eq={"layer": 1, "head": 3}))]
    shapes += [dict(k=3, where=Where(eq={"layer": 9}))]  # no row matches
    searches = [Search("c", q, vectors=True, **shape) for shape in shapes]
    plain = store.search_many([Search("c", q, **shape) for shape in shapes])
    for asked, without, s in zip(store.search_many(searches + [Search("c", q, k=4)]), plain + [None], searches):
        assert asked.ids.tolist() == without.ids.tolist() if s.k else sorted(asked.ids[0]) == sorted(without.ids[0])
        assert asked.vectors.dtype == np.float32 and asked.vectors.shape == (*asked.ids.shape, 24)
        if asked.ids.size:
            np.testing.assert_array_equal(asked.vectors, x[(asked.ids - 5) // 7])
    assert store.search_many(searches[:1] + [Search("c", q, k=4)])[1].vectors is None  # only where asked


def test_search_many_sees_rows_added_and_changed(make_store, backend):
    """A layer's head searches again after rows are added (a text's next token) and after rows move to another layer
    (an in-process store remembers which rows a layer has between searches)."""
    store = make_store(backend)
    _, attrs = filled(store)
    truth = {"id": np.arange(300) * 7 + 5, **attrs}  # every row as the store should hold it
    added = {
        "id": np.arange(300, 312) * 7 + 5,
        "layer": np.ones(12),
        "head": np.arange(12) % 4,
        "position": np.full(12, 25),
    }
    moved = {"id": truth["id"][truth["layer"] == 1][:5], **{a: np.zeros(5) for a in attrs}}
    q = rng.standard_normal((1, 24)).astype(np.float32)
    wheres = [Where(eq={"layer": 1, "head": h}, lt={"position": 30}) for h in range(4)]
    for change in (None, added, moved):
        if change:
            vectors = rng.standard_normal((len(change["id"]), 24)).astype(np.float32)
            store.upsert("c", change["id"], vectors, {a: change[a].astype(np.int64) for a in attrs})
            kept = ~np.isin(truth["id"], change["id"])
            truth = {a: np.concatenate([truth[a][kept], change[a]]) for a in truth}
        want = [sorted(truth["id"][w.mask(truth, len(truth["id"]))].tolist()) for w in wheres]
        for rows, hits in zip(want, store.search_many([Search("c", q, where=w) for w in wheres])):
            assert sorted(hits.ids[0].tolist()) == rows
        grouped = Search("c", q[None].repeat(4, 0), where=Where(eq={"layer": 1}, lt={"position": 30}), by="head")
        if len({len(rows) for rows in want}) > 1:  # moved: the heads lost different numbers of rows
            with pytest.raises(VecgptError, match="different numbers of rows"):
                Metered(store).search_many([grouped])
        else:
            (hits,) = Metered(store).search_many([grouped])
            assert [sorted(ids[0].tolist()) for ids in hits.ids] == want


@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("k", [None, 3])
def test_a_grouped_search_is_a_search_per_group(make_store, backend, m, k):
    """Search.by (a layer's heads as one search): each group's rows and distances as a search of its own gives them,
    whether the store takes groups itself (`groups`) or is sent them apart (base.apart, as the engine's Metered
    does); searches beside it are answered as before."""
    store = make_store(backend)
    filled(store)
    q = rng.standard_normal((4, m, 24)).astype(np.float32)
    grouped = Search("c", q, k, Where(eq={"layer": 1}, lt={"position": 20}), by="head")
    hits, beside = Metered(store).search_many([grouped, Search("c", q[0], k=4)])
    assert hits.ids.shape == hits.dists.shape == (4, m, k or 20)
    assert beside.ids.tolist() == store.search("c", q[0], k=4).ids.tolist()
    for h in range(4):
        one = store.search("c", q[h], k, Where(eq={"layer": 1, "head": h}, lt={"position": 20}))
        if k:
            assert hits.ids[h].tolist() == one.ids.tolist()
        for row in range(m):  # the same rows at the same distances, in whatever order the store gives
            a, b = np.argsort(hits.ids[h, row]), np.argsort(one.ids[row])
            assert hits.ids[h, row][a].tolist() == one.ids[row][b].tolist()
            np.testing.assert_allclose(hits.dists[h, row][a], one.dists[row][b], rtol=1e-6, atol=1e-5)


def test_a_grouped_search_refuses_groups_of_different_sizes_flat_queries_and_its_own_attribute(make_store, backend):
    store = make_store(backend)
    filled(store)
    one_more = {"layer": np.array([1]), "head": np.array([0]), "position": np.array([0])}
    store.upsert("c", np.array([99_999]), rng.standard_normal((1, 24)).astype(np.float32), one_more)
    q = rng.standard_normal((4, 1, 24)).astype(np.float32)
    with pytest.raises(VecgptError, match="different numbers of rows"):  # head 0 has a row more
        Metered(store).search_many([Search("c", q, where=Where(eq={"layer": 1}), by="head")])
    with pytest.raises(VecgptError):  # queries [groups, m, dim], not [m, dim]
        Metered(store).search_many([Search("c", q[:, 0], where=Where(eq={"layer": 2}), by="head")])
    with pytest.raises(VecgptError, match="also filters 'head'"):  # the groups are the heads
        Metered(store).search_many([Search("c", q, where=Where(eq={"layer": 2, "head": 1}), by="head")])


def test_upsert_overwrites_by_id_and_fetch_round_trips(make_store, backend):
    store = make_store(backend)
    x, _ = filled(store)
    new = rng.standard_normal((2, 24)).astype(np.float32)
    store.upsert(
        "c", np.array([5, 12]), new, {"layer": np.array([0, 1]), "head": np.array([0, 0]), "position": np.array([0, 0])}
    )
    assert store.count("c") == 300
    np.testing.assert_array_equal(store.fetch("c", np.array([12, 5, 19])), np.vstack([new[1], new[0], x[2]]))
    hits = store.search("c", new[:1], k=1)
    assert hits.ids[0, 0] == 5 and abs(hits.dists[0, 0]) <= dist_bound(new[:1], new[:1], "l2", backend)[0, 0]


def test_collections_drop_cleanly(make_store, backend):
    store = make_store(backend)
    filled(store, "keep")
    filled(store, "text-abc", n=30)
    assert {"keep", "text-abc"} <= set(store.collections())
    store.drop("text-abc")
    assert "text-abc" not in store.collections() and "keep" in store.collections()
    store.drop("text-abc")  # dropping twice is fine


def test_bad_dimension_is_refused(make_store, backend):
    store = make_store(backend)
    filled(store)
    with pytest.raises(VecgptError, match="dimension"):
        store.upsert("c", np.array([1]), np.zeros((1, 23), np.float32))
    with pytest.raises(VecgptError, match="dimension"):
        store.search("c", np.zeros((1, 25), np.float32))


def test_manifests_round_trip_by_key(make_store, backend):
    store = make_store(backend)
    assert store.read_manifest("abc-e2-l2") is None and store.manifests() == []
    store.write_manifest("abc-e2-l2", {"fingerprint": "abc", "m2": {"wte": 1.5}})
    store.write_manifest("def-e2-ip", {"fingerprint": "def"})
    assert store.read_manifest("abc-e2-l2") == {"fingerprint": "abc", "m2": {"wte": 1.5}}
    assert sorted(store.manifests()) == ["abc-e2-l2", "def-e2-ip"]
    store.write_manifest("abc-e2-l2", None)
    assert store.read_manifest("abc-e2-l2") is None and store.manifests() == ["def-e2-ip"]


def test_a_second_connection_sees_what_the_first_wrote(make_store, backend):
    first = make_store(backend)
    x, _ = filled(first, "kept")
    first.write_manifest("xyz", {"fingerprint": "xyz"})
    first.close()
    second = make_store(backend)
    assert "kept" in second.collections() and second.read_manifest("xyz") == {"fingerprint": "xyz"}
    np.testing.assert_array_equal(second.fetch("kept", np.array([5, 12])), x[:2])


def test_every_store_refuses_bad_calls_in_the_same_words(make_store, backend):
    store = make_store(backend)
    filled(store)
    with pytest.raises(VecgptError, match="collection 'c' exists with dim"):
        store.create("c", 25, "l2")
    with pytest.raises(VecgptError, match="upsert into 'c': 2 ids for 1 vectors"):
        store.upsert("c", np.array([1, 2]), np.zeros((1, 24), np.float32))
    with pytest.raises(VecgptError, match="filter on unknown attribute 'nope'"):
        store.search("c", np.zeros((1, 24), np.float32), where=Where(eq={"nope": 1}))
    with pytest.raises(VecgptError, match="collection 'c' has no id 4"):
        store.fetch("c", np.array([5, 4]))
    with pytest.raises(VecgptError, match="has no collection 'absent'"):
        store.count("absent")


def test_one_query_over_every_row_names_the_rows_after_they_change(make_store, backend):
    """An in-process store answers ids 0..n-1 with a shared array it keeps (base.row_order) until its rows change."""
    store = make_store(backend)
    x = rng.standard_normal((50, 8)).astype(np.float32)
    store.create("r", 8, "l2")
    store.upsert("r", np.arange(50), x)
    for added in ([], [100]):  # then a row whose id breaks 0..n-1
        if added:
            store.upsert("r", np.array(added), x[:1])
        hits = store.search("r", x[3:4])
        order = np.argsort(hits.ids[0])
        assert hits.ids[0][order].tolist() == list(range(50)) + added
        truth = true_dists(x[3:4], np.vstack([x, x[:1]])[: 50 + len(added)], "l2")[0]
        assert np.abs(hits.dists[0][order] - truth).max() <= 1e-3


@pytest.mark.parametrize("backend", ["memory", "faiss"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_grouped_search_answered_in_store_is_the_search_per_group(make_store, backend, data):
    """The in-process stores' own grouped search against the same search sent apart (base.apart, a search per
    group), on a text's rows of 1-4 heads, some rows missing or extra, with filters of equalities and ranges and
    0-4 groups of 1-3 queries: the same rows and distances, or the same refusal (groups of different sizes)."""
    store, rng = make_store(backend), np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), "seed"))
    heads, positions = data.draw(st.integers(1, 4), "heads"), data.draw(st.integers(1, 8), "positions")
    layer, pos, head = (a.ravel() for a in np.meshgrid(np.arange(3), np.arange(positions), np.arange(heads)))
    attrs = {"layer": layer, "head": head, "position": pos}
    keep = rng.random(len(layer)) > data.draw(st.sampled_from([0.0, 0.05]), "missing")  # rows lost
    extra = data.draw(st.integers(0, 3), "extra")  # rows outside the pattern, heads -1..5 among them
    attrs = {a: np.concatenate([c[keep], rng.integers(-1, 6, extra)]) for a, c in attrs.items()}
    n = len(attrs["layer"])
    store.create("g", 8, "l2", attrs=("layer", "head", "position"))
    store.upsert("g", rng.permutation(10 * n + 1)[:n], rng.standard_normal((n, 8)).astype(np.float32), attrs)
    where = Where(*(data.draw(st.sampled_from(options), kind) for kind, options in FILTERS))
    groups, m = data.draw(st.integers(0, 4), "groups"), data.draw(st.integers(1, 3), "m")
    grouped = Search("g", rng.standard_normal((groups, m, 8)).astype(np.float32), where=where, by="head")
    try:
        want = apart(lambda searches: [store.search("g", s.queries, s.k, s.where) for s in searches], [grouped])[0]
    except VecgptError:
        event("groups of different sizes")
        with pytest.raises(VecgptError, match="different numbers of rows"):
            store.search_many([grouped])
    else:
        event(f"{'no' if not want.ids.size else 'some'} rows found")
        (got,) = store.search_many([grouped])
        assert got.ids.shape == got.dists.shape == want.ids.shape
        for g, row in np.ndindex(*got.ids.shape[:2]):
            a, b = np.argsort(got.ids[g, row]), np.argsort(want.ids[g, row])
            assert got.ids[g, row][a].tolist() == want.ids[g, row][b].tolist()
            np.testing.assert_allclose(got.dists[g, row][a], want.dists[g, row][b], rtol=1e-6, atol=1e-6)
    store.drop("g")  # the next example's rows


FILTERS = [("eq", [{}, {"layer": 1}]), ("lt", [{}, {"position": 5}]), ("ge", [{}, {"position": 2}])]


class HeldQueries:
    """Query vectors that, when a store reads them (inside its call, before it sends anything), say so and wait
    until the store's close has begun: a call in flight in another thread when the main thread closes the store,
    as a Ctrl-C leaves the writer's or parallel()'s calls."""

    def __init__(self, store, queries: np.ndarray):
        self.store, self.queries, self.read, self.waited = store, queries, threading.Event(), None

    def __array__(self, dtype=None, copy=None):
        if not self.read.is_set():
            self.read.set()
            self.waited = in_flight(self.store).closing.wait(120)  # set by close before it waits: no race
        return self.queries.astype(dtype or np.float32)

    def __len__(self):
        return len(self.queries)


def test_close_waits_for_a_call_in_flight_in_another_thread(make_store, backend):
    """The store closes only after its calls in flight: SQLite's connection closed under a search in another thread
    raised apsw's ThreadingViolationError from close (a Ctrl-C's exit 1 with a traceback, not one line and 130)."""
    store = make_store(backend)
    if not getattr(type(store).close, "waits_for_calls", False):
        pytest.skip(f"{backend}'s store class is not made with base.closes_after_calls")
    filled(store, n=60)
    q = rng.standard_normal((2, 24)).astype(np.float32)
    alone = store.search("c", q, where=Where(lt={"position": 3}))
    held, out = HeldQueries(store, q), {}

    def call():
        try:
            out["hits"] = store.search("c", held, where=Where(lt={"position": 3}))
        except BaseException as e:  # noqa: BLE001 (reported below)
            out["error"] = e

    thread = threading.Thread(target=call)
    thread.start()
    assert held.read.wait(120)
    store.close()  # returns once the search has: the search ran on a store still open
    ended = dict(out)  # what the call had given when close returned
    thread.join()
    assert held.waited and "error" not in out, out.get("error")
    assert "hits" in ended
    assert np.array_equal(np.sort(out["hits"].ids, 1), np.sort(alone.ids, 1))


@pytest.mark.parametrize("backend", ["memory", "faiss"])
def test_a_grouped_search_of_no_groups_finds_nothing(make_store, backend):
    """Zero groups over rows a range matches (hypothesis found the grid dividing by zero here): no hits, no error."""
    store = make_store(backend)
    attrs = {"layer": np.zeros(3, np.int64), "head": np.zeros(3, np.int64), "position": np.arange(2, 5)}
    store.create("g", 8, "l2", attrs=("layer", "head", "position"))
    store.upsert("g", np.array([2, 11, 26]), np.ones((3, 8), np.float32), attrs)
    (got,) = store.search_many(
        [Search("g", np.zeros((0, 1, 8), np.float32), where=Where(ge={"position": 2}), by="head")]
    )
    assert got.ids.shape[0] == got.dists.shape[0] == 0
