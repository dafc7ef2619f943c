"""KNN statements on vec0 tables, a search wider than sqlite-vec's k split by id range, and its distances squared.

sqlite-vec answers `WHERE vector MATCH ? AND k = ?` with the k nearest rows, k at most LIMIT, testing the
metadata columns in the WHERE clause during the scan. A search that wants more rows (every row of a wide
matrix) is sent as pieces, each the rows whose id lies in a range of at most LIMIT ids: such a piece holds at
most LIMIT rows, so its KNN with k = LIMIT returns every one. The range is tested on ID, a metadata column
holding the row's id: vec0 applies a test of the id itself after the KNN, to the k rows it found.

sqlite-vec's distance is the L2 distance, float32 sqrt of its float32 sum: squared here in float64 (exactly: a
float32's square fits a float64), the protocol's squared L2 within gamma_{n+5} S (docs/sqlite.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from vecgpt.backends.base import Where
from vecgpt.backends.sqlite.db import quoted

LIMIT = 4096  # sqlite-vec's largest k
ID = "vecgpt_id"  # the metadata column that holds each row's id, for ranges tested during the KNN
OPS = (("=", "eq"), ("<", "lt"), (">=", "ge"))


class Table(NamedTuple):
    """A collection as the catalog records it."""

    name: str  # the vec0 table's
    dim: int
    metric: str
    attrs: list[str]
    payload: int  # floats a row


def statement(table: Table, where: Where | None, ranged: bool, vectors: bool) -> tuple[str, list[int]]:
    """The KNN for one query vector (parameters: the vector, k, then the returned values, then with `ranged`
    the id range [lo, hi)): its text and the filter's values."""
    terms, values = filter_terms(where)
    terms += [f"{ID} >= ?", f"{ID} < ?"] if ranged else []
    columns = "id, distance, vector" if vectors else "id, distance"
    text = f"SELECT {columns} FROM {quoted(table.name)} WHERE vector MATCH ? AND k = ?"
    return text + "".join(f" AND {t}" for t in terms), values


def radius_statement(table: Table, where: Where | None) -> tuple[str, list[int]]:
    """A radius search of one query vector: sqlite-vec's KNN needs a k, so a scan of the matching rows by its
    distance function, those whose distance squared (in float64, as found() squares it) is <= the radius, nearest
    first, at most k (-1: every one). Parameters: the vector, the filter's values, the radius, k."""
    terms, values = filter_terms(where)
    inner = f"SELECT id, vec_distance_l2(vector, ?) AS distance FROM {quoted(table.name)}"
    inner += " WHERE " + " AND ".join(terms) if terms else ""
    return f"SELECT id, distance FROM ({inner}) WHERE distance * distance <= ? ORDER BY distance, id LIMIT ?", values


def filter_terms(where: Where | None) -> tuple[list[str], list[int]]:
    """A filter's terms (? for each value) and their values."""
    terms, values = [], []
    for op, kind in OPS:
        for attr, value in sorted(getattr(where, kind).items()) if where is not None else []:
            terms.append(f"{quoted(attr)} {op} ?")
            values.append(int(value))
    return terms, values


def pieces(lo: int, hi: int, limit: int) -> list[tuple[int, int]]:
    """[lo, hi) as ranges of at most `limit` ids."""
    return [(a, min(a + limit, hi)) for a in range(lo, hi, limit)]


def chunks(items: list, n: int, most: int) -> list[list]:
    """items in n runs of about equal length (fewer if there are fewer items), each cut into runs of at most `most`."""
    size = -(-len(items) // max(n, 1))
    runs = [items[a : a + size] for a in range(0, len(items), size)] if items else []
    return [run[a : a + most] for run in runs for a in range(0, len(run), most)]


class Found(NamedTuple):
    ids: np.ndarray  # [n] int64
    dists: np.ndarray  # [n] float64, squared
    vectors: list[bytes] | None


def found(rows: list[tuple], vectors: bool) -> Found:
    """A KNN's rows (id, distance[, vector]) with the distances squared."""
    ids = np.fromiter((r[0] for r in rows), np.int64, len(rows))
    dists = np.fromiter((r[1] for r in rows), np.float64, len(rows))
    return Found(ids, dists * dists, [r[2] for r in rows] if vectors else None)


def merged(parts: Sequence[Found], k: int | None) -> Found:
    """One query's rows from its pieces: all of them, or the k nearest by (distance, id)."""
    if len(parts) == 1 and (k is None or len(parts[0].ids) <= k):
        return parts[0]
    ids, dists = np.concatenate([p.ids for p in parts]), np.concatenate([p.dists for p in parts])
    blobs = None if parts[0].vectors is None else [b for p in parts for b in p.vectors]
    if k is None:
        return Found(ids, dists, blobs)
    best = np.lexsort((ids, dists))[:k]
    return Found(ids[best], dists[best], None if blobs is None else [blobs[i] for i in best])


def floats(blobs: list[bytes], width: int) -> np.ndarray:
    """float32 blobs of `width` floats each as [len(blobs), width]."""
    return np.frombuffer(b"".join(blobs), np.float32).reshape(len(blobs), width)
