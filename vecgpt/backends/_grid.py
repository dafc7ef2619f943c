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
    room: tuple | None = None  # (slots, ids, along, [columns used]): the arrays the three above are views of


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
    if (fast := in_position_order(g, new, values, along, groups)) is not None:
        return appended(g, fast, ids[fast], along[::groups])
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
    return appended(g, slots, ids[slots], v[0])


def in_position_order(g: Grid, new, values, along, groups: int) -> np.ndarray | None:
    """The rows as columns [G, n] where they came as a text writes them, a position's groups in order then the next
    position's, after g's last; else None. Told on lists: a few dozen values, where each numpy call costs more."""
    heads, at = values.tolist(), along.tolist()
    n, first = len(at) // groups, at[::groups]
    if heads != list(range(groups)) * n or at != [p for p in first for _ in range(groups)]:
        return None
    if any(a >= b for a, b in zip(first, first[1:])) or (len(g.along) and first[0] <= g.along[-1]):
        return None
    return new.reshape(n, groups).T


def appended(g: Grid, slots: np.ndarray, ids: np.ndarray, along: np.ndarray) -> Grid:
    """g with these columns after its own, written into the room behind it (twice as much made when full): a text's
    grid grows by a column a token, and a copy of it each time would be a pass over the grid. Only the grid that
    last used the room writes into it, so the columns of an earlier grid never change."""
    n, more, room = len(g.along), len(along), g.room
    if room is None or room[3][0] != n or len(room[2]) < n + more:
        size = max(2 * (n + more), 64)
        room = (
            np.empty((len(slots), size), np.int64),
            np.empty((len(slots), size), np.int64),
            np.empty(size, np.int64),
        )
        room[0][:, :n], room[1][:, :n], room[2][:n] = g.slots, g.ids, g.along
        room += ([n],)
    room[0][:, n : n + more], room[1][:, n : n + more], room[2][n : n + more] = slots, ids, along
    room[3][0] = n + more
    return Grid(room[0][:, : n + more], room[1][:, : n + more], room[2][: n + more], room)


def columns(g: Grid, lo: int | None, hi: int | None) -> Grid:
    """The columns whose ordering value v has lo <= v < hi (None: unbounded)."""
    a = 0 if lo is None else int(np.searchsorted(g.along, lo, "left"))
    b = len(g.along) if hi is None else int(np.searchsorted(g.along, hi, "left"))
    return Grid(g.slots[:, a:b], g.ids[:, a:b], g.along[a:b])  # no room: a part is never extended
