"""turbopuffer filter expressions for the turbopuffer backend: a `Where` -> a filter, and the id ranges
used to split a subquery that may have been cut short at the 10,000-row limit."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vecgpt.backends.base import Where

MATCH_ALL = ["id", "Gte", 0]  # kNN requires a filter; this one matches every (u64) id


def to_filter(where: Where | None, skip: str | None = None) -> list:
    """The `Where` as a turbopuffer filter, leaving out equality on `skip` (the partition attribute)."""
    conds = []
    if where is not None:
        conds += [[a, "Eq", int(v)] for a, v in where.eq.items() if a != skip]
        conds += [[a, "Lt", int(v)] for a, v in where.lt.items()]
        conds += [[a, "Gte", int(v)] for a, v in where.ge.items()]
    if not conds:
        return MATCH_ALL
    return conds[0] if len(conds) == 1 else ["And", conds]


def with_range(f: list, lo: int, hi: int) -> list:
    """f and lo <= id < hi."""
    rng = [["id", "Gte", int(lo)], ["id", "Lt", int(hi)]]
    if f == MATCH_ALL:
        return ["And", rng]
    return ["And", (f[1] if f[0] == "And" else [f]) + rng]


def range_of(f: list):
    """(lo, hi) of a filter made by `with_range`, else None."""
    if f and f[0] == "And":
        lo = [c[2] for c in f[1] if c[:2] == ["id", "Gte"]]
        hi = [c[2] for c in f[1] if c[:2] == ["id", "Lt"]]
        if lo and hi:
            return lo[-1], hi[-1]
    return None


def strip_range(f: list) -> list:
    """The filter without the id range that `with_range` added."""
    if f and f[0] == "And" and range_of(f) is not None:
        rest = [c for c in f[1] if c[:2] not in (["id", "Gte"], ["id", "Lt"])]
        return MATCH_ALL if not rest else (rest[0] if len(rest) == 1 else ["And", rest])
    return f
