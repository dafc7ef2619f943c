"""The in-process stores' grouped key search (vecgpt/backends/_grid.py): a layer's keys as a grid of heads by
positions, a position range a slice of its columns. Whatever order rows were written in, a search finds exactly
the rows its filter matches, each head's in position order, with the distances of a search of those rows alone."""

from __future__ import annotations

import numpy as np
import pytest

from vecgpt.backends import faiss, memory
from vecgpt.backends.base import Search, Where
from vecgpt.errors import VecgptError

HEADS, DIM = 3, 8


def write(store, name, rows, rng) -> dict:
    """rows [(layer, head, position)] written in this order, one upsert each; {(layer, head, position): vector}."""
    store.create(name, DIM, "ip", ["layer", "head", "position"])
    vectors = {}
    for layer, head, pos in rows:
        v = rng.standard_normal((1, DIM)).astype(np.float32)
        store.upsert(
            name,
            np.array([layer * 10_000 + head * 1_000 + pos]),
            v,
            {"layer": np.array([layer]), "head": np.array([head]), "position": np.array([pos])},
        )
        vectors[(layer, head, pos)] = v[0]
    return vectors


def expected(vectors, q, layer, lo, hi):  # each head's rows at lo <= position < hi, by position: (ids, -q.x)
    ids, dists = [], []
    for h in range(HEADS):
        pos = sorted(p for (l_, h_, p) in vectors if l_ == layer and h_ == h and lo <= p < hi)
        ids.append([layer * 10_000 + h * 1_000 + p for p in pos])
        dists.append([[-float(np.dot(qq.astype(np.float64), vectors[(layer, h, p)])) for p in pos] for qq in q[h]])
    return np.array(ids), np.array(dists)


def search(store, name, q, layer, lo, hi):
    where = Where(eq={"layer": layer}, ge={"position": lo} if lo else {}, lt={"position": hi})
    return store.search_many([Search(name, q, where=where, by="head")])[0]


@pytest.fixture(params=["memory", "faiss"])
def store(request, tmp_path):
    return (memory.connect if request.param == "memory" else faiss.connect)(str(tmp_path))


def in_order(positions, layers=(0, 1)):
    return [(layer, h, p) for p in positions for layer in layers for h in range(HEADS)]


@pytest.mark.parametrize(
    "rows",
    [
        in_order(range(9)),  # as a text writes them
        in_order([4, 0, 7, 1, 2, 8, 3, 6, 5]),  # positions out of order: no grid, rows filtered one by one
        [(layer, h, p) for p in range(9) for layer in (1, 0) for h in reversed(range(HEADS))],  # heads reversed
    ],
)
def test_a_grouped_search_finds_the_rows_its_filter_matches(store, rows):
    rng = np.random.default_rng(0)
    vectors = write(store, "text-grid", rows, rng)
    q = rng.standard_normal((HEADS, 2, DIM)).astype(np.float32)
    for layer, lo, hi in [(0, 0, 9), (1, 0, 5), (0, 3, 7), (1, 8, 9), (0, 4, 4)]:
        hits = search(store, "text-grid", q, layer, lo, hi)
        ids, dists = expected(vectors, q, layer, lo, hi)
        order = np.argsort(hits.ids, axis=-1)
        assert np.array_equal(np.take_along_axis(hits.ids, order, -1), np.broadcast_to(ids[:, None], hits.ids.shape))
        assert np.allclose(np.take_along_axis(hits.dists, order, -1), dists.reshape(hits.dists.shape), atol=1e-5)


def test_rows_appended_after_a_search_are_found_by_the_next(store):
    rng = np.random.default_rng(1)
    vectors = write(store, "text-grid", in_order(range(4)), rng)
    q = rng.standard_normal((HEADS, 1, DIM)).astype(np.float32)
    assert search(store, "text-grid", q, 0, 0, 9).ids.shape == (HEADS, 1, 4)
    vectors |= write(store, "text-grid", in_order(range(4, 6)), rng)
    hits = search(store, "text-grid", q, 0, 0, 9)
    assert np.array_equal(hits.ids[:, 0], expected(vectors, q, 0, 0, 9)[0])


def test_a_head_missing_a_row_is_refused_in_one_line(store):
    rows = [r for r in in_order(range(5)) if r != (0, 1, 3)]
    write(store, "text-grid", rows, np.random.default_rng(2))
    with pytest.raises(VecgptError, match="matched different numbers of rows.*start the text again"):
        search(store, "text-grid", np.zeros((HEADS, 1, DIM), np.float32), 0, 0, 5)


def test_positions_appended_out_of_order_after_a_search_are_found(store):
    rng = np.random.default_rng(3)
    vectors = write(store, "text-grid", in_order(range(4)), rng)
    q = rng.standard_normal((HEADS, 1, DIM)).astype(np.float32)
    for more in ([7], [5], [4, 6]):  # after a grid was made: a later position, an earlier one, then the gap filled
        search(store, "text-grid", q, 1, 0, 9)
        vectors |= write(store, "text-grid", in_order(more), rng)
        hits = search(store, "text-grid", q, 1, 2, 9)
        ids, dists = expected(vectors, q, 1, 2, 9)
        order = np.argsort(hits.ids, axis=-1)
        assert np.array_equal(np.take_along_axis(hits.ids, order, -1)[:, 0], ids)
        assert np.allclose(np.take_along_axis(hits.dists, order, -1)[:, 0], dists[:, 0], atol=1e-5)


def test_a_grid_extended_twice_keeps_the_columns_it_gave():
    """A grid grows into room kept behind it; a second extension of the same grid must not write over the first's."""
    from vecgpt.backends import _grid

    base = _grid.extended(
        _grid.empty(2), np.arange(4), np.array([0, 1, 0, 1]), np.array([0, 0, 1, 1]), np.arange(4) * 10, 2
    )
    one = _grid.appended(base, np.array([[4], [5]]), np.array([[40], [50]]), np.array([2]))
    kept = one.ids.copy()
    two = _grid.appended(base, np.array([[6], [7]]), np.array([[60], [70]]), np.array([5]))
    assert np.array_equal(one.ids, kept) and one.along.tolist() == [0, 1, 2]
    assert two.ids.tolist() == [[0, 20, 60], [10, 30, 70]] and two.along.tolist() == [0, 1, 5]
    longer = one
    for p in range(3, 200):  # past the first room: made again, the columns carried over
        longer = _grid.appended(longer, np.array([[p], [p]]), np.array([[p], [p]]), np.array([p]))
    assert longer.along.tolist() == list(range(200)) and np.array_equal(longer.ids[:, :3], kept)
