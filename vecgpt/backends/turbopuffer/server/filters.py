"""Filter evaluation: a turbopuffer filter expression -> a boolean mask over a namespace's rows.

Eq NotEq In NotIn Lt Lte Gt Gte, And Or Not; Lt/Lte also match null, as documented. Columns come from
`Namespace.column` (int64 where every value is an int, else objects)."""

from __future__ import annotations

import numpy as np

from vecgpt.backends.turbopuffer.server.limits import ApiError, filterable

OPS = {"Eq": np.equal, "Lt": np.less, "Lte": np.less_equal, "Gt": np.greater, "Gte": np.greater_equal}


def mask(ns, f) -> np.ndarray:
    """Rows of `ns` that match filter `f`."""
    if not isinstance(f, list) or not f:
        raise ApiError(400, f"invalid filter {f!r}")
    if f[0] in ("And", "Or") and len(f) == 2:
        return _and_or(ns, f)
    if f[0] == "Not" and len(f) == 2:
        return ~mask(ns, f[1])
    if len(f) != 3 or not isinstance(f[0], str):
        raise ApiError(400, f"invalid filter {f!r}")
    return _condition(ns, *f)


def _and_or(ns, f) -> np.ndarray:
    if not isinstance(f[1], list):
        raise ApiError(400, f"{f[0]} takes a list of filters")
    parts = [mask(ns, g) for g in f[1]]
    if not parts:
        return np.full(ns.n, f[0] == "And")
    return np.logical_and.reduce(parts) if f[0] == "And" else np.logical_or.reduce(parts)


def _condition(ns, attr, op, value) -> np.ndarray:
    if not filterable(ns.schema_extra, attr):
        raise ApiError(400, f"attribute {attr!r} is not filterable (its schema says filterable: false)")
    values, present = ns.column(attr)
    if op in ("Eq", "NotEq"):
        hit = ~present if value is None else present & _compare(values, present, "Eq", value)
        return hit if op == "Eq" else ~hit
    if op in ("In", "NotIn"):
        if not isinstance(value, list):
            raise ApiError(400, f"{op} takes a list")
        hit = present & (
            np.isin(values, value)
            if values.dtype != object
            else np.fromiter((v in set(value) for v in values), bool, len(values))
        )
        return hit if op == "In" else ~hit
    if op in ("Lt", "Lte"):
        return ~present | _compare(values, present, op, value)
    if op in ("Gt", "Gte"):
        return present & _compare(values, present, op, value)
    raise ApiError(400, f"filter operator {op!r} is not supported by this local server")


def _compare(values, present, op, value) -> np.ndarray:
    if values.dtype != object:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return np.zeros(len(values), bool)
        return OPS[op](values, value)
    fn = {
        "Eq": lambda a: a == value,
        "Lt": lambda a: a < value,
        "Lte": lambda a: a <= value,
        "Gt": lambda a: a > value,
        "Gte": lambda a: a >= value,
    }[op]
    out = np.zeros(len(values), bool)
    for i, (v, p) in enumerate(zip(values, present)):
        if p:
            try:
                out[i] = fn(v)
            except TypeError:
                out[i] = False
    return out
