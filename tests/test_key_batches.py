"""One round's key searches for every text of a step in one search_many: a grouped Search (by "head") a text, each
on its own collection, as the engine sends them (grouped searches sent apart to a store without `groups`).

A text's hits are bit for bit what its search gives alone, whatever texts come with it; a missing collection fails
the call with a VecgptError (the engine then retries each text apart); and where the store can answer several
texts at once (one SQL statement on pgvector, SQLite and DuckDB) the call is fewer requests than a call a text.
"""

from __future__ import annotations

import numpy as np
import pytest

from vecgpt.backends.base import Hits, Search, Where, tally
from vecgpt.errors import VecgptError
from vecgpt.meter import Call, bound

HEADS, DIM, LAYERS = 4, 16, 2
POSITIONS = [3, 9, 1, 6, 12, 4, 7, 2]  # each text's length: 8 texts
FEWER = {"pgvector", "sqlite", "duckdb"}  # a list of texts' key searches is one statement


def keys(store, name: str, n: int, rng) -> None:
    """A text's keys: every (layer, head, position) of n positions."""
    layer, head, position = (a.ravel() for a in np.meshgrid(range(LAYERS), range(HEADS), range(n), indexing="ij"))
    store.create(name, DIM, "l2", attrs=("layer", "head", "position"))
    vectors = rng.standard_normal((len(layer), DIM)).astype(np.float32)
    store.upsert(name, np.arange(len(layer)), vectors, {"layer": layer, "head": head, "position": position})


def key_search(name: str, n: int, m: int, rng) -> Search:
    """A layer's key search of a text reading m rows (a prefill chunk's, or a decode step's one): its heads' queries
    against its positions before its last."""
    queries = rng.standard_normal((HEADS, m, DIM)).astype(np.float32)
    return Search(name, queries, where=Where(eq={"layer": 1}, lt={"position": n}), by="head")


def sent(store, searches: list[Search]) -> list[Hits]:
    return bound(store, Call("search_many", (searches,), {}))()


@pytest.fixture
def texts(make_store, backend):
    """A store holding 8 texts' keys, and a key search for each (m 1 or 3)."""
    store, rng = make_store(backend), np.random.default_rng(7)
    searches = []
    for t, n in enumerate(POSITIONS):
        keys(store, f"text-{t}", n, rng)
        searches.append(key_search(f"text-{t}", n, 3 if t % 3 == 0 else 1, rng))
    return store, searches


def by_id(hits: Hits) -> tuple[np.ndarray, np.ndarray]:
    """Each query's ids and distances sorted by id (a search of every row returns them in any order)."""
    order = np.argsort(hits.ids, axis=-1, kind="stable")
    return np.take_along_axis(hits.ids, order, -1), np.take_along_axis(hits.dists, order, -1)


def test_texts_searched_together_get_the_bits_each_gets_alone(texts):
    store, searches = texts
    together = sent(store, searches)
    for s, n, got in zip(searches, POSITIONS, together):
        (alone,) = sent(store, [s])
        assert got.ids.shape == (HEADS, len(s.queries[0]), n)
        ids, dists = by_id(got)
        want_ids, want_dists = by_id(alone)
        assert np.array_equal(ids, want_ids)
        assert np.array_equal(dists, want_dists), s.collection  # exactly: no text's bits depend on another's
        assert np.array_equal(ids % n, np.broadcast_to(np.arange(n), ids.shape))  # its own rows, each position once


def test_a_missing_collection_fails_the_whole_call(texts):
    store, searches = texts
    gone = key_search("text-gone", 3, 1, np.random.default_rng(0))
    with pytest.raises(VecgptError, match="text-gone"):
        sent(store, [*searches[:3], gone, *searches[3:]])
    assert len(sent(store, searches)) == len(searches)  # the others, apart from it, still answer


def test_texts_searched_together_take_fewer_requests(texts, backend):
    store, searches = texts
    with tally() as together:
        sent(store, searches)
    apart = 0
    for s in searches:
        with tally() as alone:
            sent(store, [s])
        apart += alone["requests"] or 1  # a store that records nothing: a request a call (as the meter counts)
    assert (together["requests"] or 1) <= apart
    if backend in FEWER:
        assert together["requests"] == 1 < apart == len(searches)
