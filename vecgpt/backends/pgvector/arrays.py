"""Search results' bigint[], float8[] and real[][] read straight into numpy arrays.

psycopg reads a binary array element by element into Python ints and floats; a token's searches
return about 170,000 of them (every output unit's id and distance), which then go back into numpy.
PostgreSQL's binary array is a header (dimensions, a has-nulls flag, the element type, then size and
lower bound per dimension) and each element as (int32 length, value): without nulls, one frombuffer.
"""

from __future__ import annotations

import numpy as np
from psycopg import postgres
from psycopg.adapt import Loader
from psycopg.pq import Format

from vecgpt.errors import VecgptError


def read_array(data, dtype: str) -> np.ndarray:
    """A binary array of 8-byte elements without nulls, as big-endian `dtype`: [n], or [n, m] where it has two
    dimensions (a search's distances to m queries a row)."""
    head = np.frombuffer(data, ">i4", count=3)
    if head[0] == 0:  # empty
        return np.zeros(0, dtype)
    if head[0] not in (1, 2) or head[1]:
        raise VecgptError("pgvector search: the server sent an array with nulls or over two dimensions")
    shape = np.frombuffer(data, ">i4", count=2 * head[0], offset=12)[::2].tolist()
    cells = np.frombuffer(
        data, np.dtype([("len", ">i4"), ("value", dtype)]), count=int(np.prod(shape)), offset=12 + 8 * int(head[0])
    )
    return cells["value"].reshape(shape)


class Int8Array(Loader):
    format = Format.BINARY

    def load(self, data) -> np.ndarray:
        return read_array(data, ">i8").astype(np.int64)


class Float8Array(Loader):
    format = Format.BINARY

    def load(self, data) -> np.ndarray:
        return read_array(data, ">f8").astype(np.float64)


class Float4Rows(Loader):
    """real[][] (a search's rows' vectors, one real[] each) as float32 [n, dim]."""

    format = Format.BINARY

    def load(self, data) -> np.ndarray:
        head = np.frombuffer(data, ">i4", count=3)
        if head[0] == 0:  # empty
            return np.zeros((0, 0), np.float32)
        if head[0] != 2 or head[1]:
            raise VecgptError("pgvector search: the server sent vectors with nulls or not as rows")
        n, _, dim, _ = np.frombuffer(data, ">i4", count=4, offset=12).tolist()
        cells = np.frombuffer(data, np.dtype([("len", ">i4"), ("value", ">f4")]), count=n * dim, offset=28)
        return cells["value"].astype(np.float32).reshape(n, dim)


def numpy_arrays(cursor):
    """The cursor, reading bigint[], float8[] and real[][] as numpy arrays."""
    cursor.adapters.register_loader(postgres.types["int8"].array_oid, Int8Array)  # by name: the element's oid
    cursor.adapters.register_loader(postgres.types["float8"].array_oid, Float8Array)
    cursor.adapters.register_loader(postgres.types["float4"].array_oid, Float4Rows)
    return cursor
