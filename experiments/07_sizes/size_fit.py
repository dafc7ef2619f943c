"""The size experiment's arithmetic: the exponent of a power law fitted on logs, and what a token costs on
turbopuffer in each layout at a shape (from the plan alone)."""

from __future__ import annotations

import re

import numpy as np

LAYOUT_ORDER = ("four", "three", "five")


def exponent(x, y) -> float | None:
    """b of y = c x^b, least squares on log y against log x over the positive pairs; None under two of them or
    where every x is the same."""
    pairs = [(a, b) for a, b in zip(x, y) if a is not None and b is not None and a > 0 and b > 0]
    if len(pairs) < 2 or len({a for a, _ in pairs}) < 2:
        return None
    lx, ly = np.log([a for a, _ in pairs]), np.log([b for _, b in pairs])
    slope, _ = np.polyfit(lx, ly, 1)
    return float(slope)


def layout_costs(hp, key_replicas: int = 2) -> list[dict]:
    """A token's dollars on turbopuffer in each layout, one copy of the matrices: the backend's estimate_cost on the
    plan, as `vecgpt load --dry-run` prints it, with its figures read back."""
    from vecgpt.backends.turbopuffer.cost import estimate_cost
    from vecgpt.loading import plan, text_row

    out = []
    for layout in LAYOUT_ORDER:
        rows = plan(hp, "l2", layout)
        said = estimate_cost(rows, 1, key_replicas, hp.n_head, text_row(hp, layout))
        out.append({"layout": layout, **read_estimate(said), "estimate": said})
    return out


def read_estimate(said: str) -> dict:
    """The figures of estimate_cost's text: documents, GB, load and monthly dollars, a token's subqueries and
    dollars."""
    found = {
        "documents": r"([\d,]+) documents",
        "gb": r"([\d,.]+) GB logical",
        "load_dollars": r"load \(writes.*?\): \$([\d,.]+)",
        "storage_dollars_month": r"storage at .*?: \$([\d,.]+)",
        "subqueries_per_token": r"(\d+) kNN subqueries",
        "requests_per_token": r"kNN subqueries \(.*?\) in ([\d,]+) requests",
        "dollars_per_token": r"per generated token:.*: \$([\d.]+)",
    }
    out = {}
    for name, pattern in found.items():
        m = re.search(pattern, said)
        out[name] = None if m is None else float(m.group(1).replace(",", ""))
    return out
