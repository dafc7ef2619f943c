"""A text collection's rows on disk, for the in-process stores: an append-only log of self-describing chunks.

One chunk per upsert (the first, written by create, holds no rows):

    b"VGK1" | uint32 meta bytes | uint64 body bytes | uint32 crc32(meta + body) | meta | body

meta is JSON {"dim", "metric", "attrs", "payload", "rows"}; the body is ids int64 [rows], vectors
float32 [rows, dim], attributes int64 [len(attrs), rows], payload float32 [rows, payload]. A chunk cut
short (a kill in the middle of a write) or garbled fails its length or crc check: reading stops there,
and the next append cuts it off. Reading keeps every chunk's rows in order; the caller keeps the last
write of each id.

No fsync: a process killed, even by kill -9, leaves what write() returned in the kernel's page cache,
which reaches the disk without it. Only a power cut can lose the last chunks, and then whole chunks.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path
from typing import NamedTuple

import numpy as np

from vecgpt.backends import base

MAGIC = b"VGK1"
HEAD = struct.Struct("<4sIQI")


class Rows(NamedTuple):
    ids: np.ndarray  # [n] int64
    vectors: np.ndarray  # [n, dim] float32
    attrs: dict[str, np.ndarray]  # name -> [n] int64
    payload: np.ndarray  # [n, width] float32


def last_rows(name: str, rows: Rows, columns: list[str]) -> Rows:
    """base.last_writes, the payload riding beside the vectors (float32 both: its bits are kept)."""
    dim = rows.vectors.shape[1]
    ids, both, attrs = base.last_writes(name, rows.ids, np.hstack([rows.vectors, rows.payload]), rows.attrs, columns)
    return Rows(ids, both[:, :dim], attrs, both[:, dim:])


def joined(name: str, chunks: list[Rows], columns: list[str]) -> Rows:
    """The rows of several chunks as one write: the last write of each id, in the order they were written."""
    rows = Rows(
        np.concatenate([c.ids for c in chunks]),
        np.concatenate([c.vectors for c in chunks]),
        {a: np.concatenate([c.attrs[a] for c in chunks]) for a in columns},
        np.concatenate([c.payload for c in chunks]),
    )
    return last_rows(name, rows, columns)


def chunk(meta: dict, rows: Rows) -> bytes:
    """One chunk: `meta` (dim, metric, attrs, payload) and the rows."""
    head = json.dumps({**meta, "rows": len(rows.ids)}).encode()
    columns = [np.asarray(rows.attrs[a], np.int64) for a in meta["attrs"]]
    arrays = [np.asarray(rows.ids, np.int64), np.asarray(rows.vectors, np.float32), *columns, rows.payload]
    body = b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)
    return HEAD.pack(MAGIC, len(head), len(body), zlib.crc32(body, zlib.crc32(head))) + head + body


def _parse(data: memoryview, at: int) -> tuple[dict, Rows, int] | None:
    """The chunk starting at byte `at` and where the next starts, or None if it is cut short or garbled."""
    if len(data) - at < HEAD.size:
        return None
    magic, n_head, n_body, crc = HEAD.unpack_from(data, at)
    start = at + HEAD.size
    end = start + n_head + n_body
    if magic != MAGIC or end > len(data) or zlib.crc32(data[start:end]) != crc:
        return None
    meta = json.loads(bytes(data[start : start + n_head]))
    n, dim, width, names = meta["rows"], meta["dim"], meta["payload"], meta["attrs"]
    body = data[start + n_head : end]
    ids = np.frombuffer(body, np.int64, n)
    vectors = np.frombuffer(body, np.float32, n * dim, 8 * n).reshape(n, dim)
    columns = np.frombuffer(body, np.int64, n * len(names), 8 * n + 4 * n * dim).reshape(len(names), n)
    payload = np.frombuffer(body, np.float32, n * width, 8 * n * (1 + len(names)) + 4 * n * dim).reshape(n, width)
    return meta, Rows(ids, vectors, dict(zip(names, columns)), payload), end


def read(path: Path, start: int = 0) -> tuple[dict | None, list[Rows], int]:
    """The first chunk's meta (None if there is no whole chunk), every whole chunk's rows, and where they end."""
    data = memoryview(path.read_bytes())
    meta, rows, at = None, [], start
    while (parsed := _parse(data, at)) is not None:
        meta = meta or parsed[0]
        rows.append(parsed[1])
        at = parsed[2]
    return meta, rows, at


def create(path: Path, data: bytes) -> int:
    """A new log holding `data`, written beside it and renamed into place; its size."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(data)
    tmp.replace(path)
    return len(data)


def append(path: Path, data: bytes, end: int) -> int:
    """Add a chunk after byte `end` (where this process last read or wrote); where the log now ends.
    Anything past `end` that is not whole chunks (a writer killed mid-chunk) is cut off first."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if os.fstat(fd).st_size != end:
            end = read(path, end if os.fstat(fd).st_size > end else 0)[2]
            os.ftruncate(fd, end)
        os.lseek(fd, end, os.SEEK_SET)
        view = memoryview(data)
        while view:  # write() may take less than it was given
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    return end + len(data)
