"""A grouped search's rows as a grid: a text's keys of one layer, [heads, positions] slots, for the in-process stores.

A text writes every head of a position together, so each head of a layer holds the same positions, and each head's
rows, in slot order, hold them ascending. Then the rows a key search matches (a layer's, positions lo..hi-1, by head)
are a slice of the grid's columns, found by two binary searches: no pass over the layer's rows, no mask, no stack a
search. Where rows are not so laid out (a position written out of order, a head missing a row) `extended` says None
and the caller filters row by row.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Grid(NamedTuple):
    slots: np.ndarray  # [G, n]: group g's rows, ascending in `along`
    ids: np.ndarray  # [G, n]: their ids
    along: np.ndarray  # [n]: the value of the ordering attribute in each column, every group alike


def empty(groups: int) -> Grid:  # a grid of no columns, to extend
    return Grid(np.zeros((groups, 0), np.int64), np.zeros((groups, 0), np.int64), np.zeros(0, np.int64))


def extended(g: Grid, new: np.ndarray, values: np.ndarray, along: np.ndarray, ids: np.ndarray, groups: int):
    """g with the rows `new` (ascending slots, with their group `values` and `along` values) as columns after its
    own: a text's next positions. None where they are not whole columns that come after g's."""
    if not len(new):
        return g
    if not groups:  # rows, but no group to hold them: filtered row by row
        return None
    n = len(new) // groups
    if len(new) != n * groups:
        return None
    order = np.lexsort((new, values))  # by group, then slot
    by_group, v, slots = (
        values[order].reshape(groups, n),
        along[order].reshape(groups, n),
        new[order].reshape(groups, n),
    )
    if not (by_group == np.arange(groups)[:, None]).all() or not (v == v[0]).all():
        return None
    if (n > 1 and not (v[0, 1:] > v[0, :-1]).all()) or (len(g.along) and v[0, 0] <= g.along[-1]):
        return None
    return Grid(np.hstack([g.slots, slots]), np.hstack([g.ids, ids[slots]]), np.concatenate([g.along, v[0]]))


def columns(g: Grid, lo: int | None, hi: int | None) -> Grid:
    """The columns whose ordering value v has lo <= v < hi (None: unbounded)."""
    a = 0 if lo is None else int(np.searchsorted(g.along, lo, "left"))
    b = len(g.along) if hi is None else int(np.searchsorted(g.along, hi, "left"))
    return Grid(g.slots[:, a:b], g.ids[:, a:b], g.along[a:b])
