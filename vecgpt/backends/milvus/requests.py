"""Milvus's limits on a request, the pieces a request is split into to stay inside them, filters as Milvus
expressions, and search results as arrays."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vecgpt.backends.base import Hits, Where
from vecgpt.errors import VecgptError


@dataclass(frozen=True)
class Limits:
    """What Milvus takes in one request (milvus.io, "Milvus Limits"); tests inject smaller ones."""

    top_k: int = 16_384  # rows a query of a search may return
    nq: int = 16_384  # query vectors a search may carry
    bytes: int = 64 << 20  # an insert, search or query request (and what we let an answer be)
    dim: int = 32_768  # a vector field's dimension

    def check_dim(self, name: str, dim: int) -> None:
        if not 1 <= dim <= self.dim:
            raise VecgptError(
                f"collection {name!r}: Milvus takes vectors of dimension 1 to {self.dim:,}, not {dim:,}; "
                f"use another store for this model"
            )


SLACK = 1 << 20  # bytes of a request left for its framing (field names, the filter, protobuf headers)


def row_batches(n: int, row_bytes: int, limits: Limits) -> list[slice]:
    """An upsert of n rows of row_bytes each, as requests that each stay under the byte limit."""
    per = max(1, (limits.bytes - SLACK) // max(row_bytes, 1))
    return [slice(a, min(a + per, n)) for a in range(0, n, per)]


def query_batches(m: int, dim: int, limit: int, hit_bytes: int, limits: Limits) -> list[slice]:
    """A search of m queries answering up to `limit` rows each, as requests under the nq limit whose queries and
    answers stay under the byte limit."""
    per_query = max(4 * dim, limit * hit_bytes)
    per = max(1, min(limits.nq, (limits.bytes - SLACK) // per_query))
    return [slice(a, min(a + per, m)) for a in range(0, m, per)]


def id_batches(n: int, row_bytes: int, limits: Limits) -> list[slice]:
    """A fetch of n ids, as requests of at most top_k ids whose answers stay under the byte limit."""
    per = max(1, min(limits.top_k, (limits.bytes - SLACK) // max(row_bytes, 1)))
    return [slice(a, min(a + per, n)) for a in range(0, n, per)]


OPS = {np.equal: "==", np.less: "<", np.greater_equal: ">="}


def expression(where: Where | None) -> str:
    """A Where as a Milvus boolean expression ("" keeps every row), its terms in a fixed order."""
    if where is None:
        return ""
    return " and ".join(sorted(f"{name} {OPS[op]} {int(value)}" for op, name, value in where.conditions()))


def hit_arrays(result, m: int, negate: bool) -> tuple[np.ndarray, np.ndarray]:
    """A search's answer (pymilvus SearchResult, ids and scores only) as ids [m, n] int64 and distances [m, n]
    (the float32 scores in float64; an inner product negated: lower is better)."""
    counts = {len(hits.ids) for hits in result}
    if len(counts) > 1:  # every query matches the same rows: fewer for one means rows changed under the search
        raise VecgptError("Milvus answered the queries of one search with different numbers of rows; search again")
    n = counts.pop() if counts else 0
    ids = np.array([hits.ids for hits in result], np.int64).reshape(m, n)
    dists = np.array([hits.distances for hits in result], np.float64).reshape(m, n)
    return ids, -dists if negate else dists


def hit_vectors(result, m: int, n: int, dim: int) -> np.ndarray:
    """The stored vectors a search was asked for (output field "vector"), [m, n, dim] float32."""
    rows = [hit["entity"]["vector"] for hits in result for hit in hits]
    return np.array(rows, np.float32).reshape(m, n, dim)


def within(where: Where | None, ids: np.ndarray, most: int) -> list[str]:
    """The filter `where` narrowed to each range of at most `most` of the collection's sorted ids."""
    ranges = [(ids[a], ids[min(a + most, len(ids)) - 1]) for a in range(0, len(ids), most)]
    return [" and ".join(filter(None, [expression(where), f"id >= {lo} and id <= {hi}"])) for lo, hi in ranges]


def joined(parts: list[Hits], axis: int) -> Hits:
    """Hits of one search's requests: its queries split (axis 0) or its rows (axis 1)."""
    vectors = None if parts[0].vectors is None else np.concatenate([h.vectors for h in parts], axis)
    return Hits(np.concatenate([h.ids for h in parts], axis), np.concatenate([h.dists for h in parts], axis), vectors)


def nearest(hits: Hits, k: int) -> Hits:
    """Each query's k nearest of its rows, nearest first (rows at equal distances in the order they came)."""
    order = np.argsort(hits.dists, axis=1, kind="stable")[:, :k]
    vectors = None if hits.vectors is None else np.take_along_axis(hits.vectors, order[:, :, None], 1)
    return Hits(np.take_along_axis(hits.ids, order, 1), np.take_along_axis(hits.dists, order, 1), vectors)
