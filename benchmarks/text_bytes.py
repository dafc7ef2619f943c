"""What a text costs a store: bytes on disk a position, a decode step's writes, fetching a whole text.

    python benchmarks/text_bytes.py [memory faiss lancedb ...] [--positions 64]

GPT-2 small's layout: 12 layers x 12 heads, a key of 64 floats tagged layer/head/position and its value
(64 floats) as payload. A decode step writes one upsert per layer (its 12 heads' rows). Bytes a position
are the growth of the store's folder over --positions positions (LanceDB: after a compaction, and before
it). Then a 1,024-position text (147,456 rows, written in 4,096-row batches) is fetched whole, with its
payload, by a fresh connection (opening/replaying included) and again.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from vecgpt.backends.base import get_store

L, H, D, W, CTX = 12, 12, 64, 64, 1024
ATTRS = ("layer", "head", "position")
rng = np.random.default_rng(0)


def disk(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def tags(ids: np.ndarray) -> dict:
    return {"layer": ids // (H * CTX), "head": ids // CTX % H, "position": ids % CTX}


def decode(store, name: str, positions: int) -> list[float]:
    """Write `positions` positions as decoding does; the seconds each step's writes took."""
    store.create(name, D, "l2", ATTRS, payload=W)
    times = []
    for p in range(positions):
        start = time.perf_counter()
        for layer in range(L):
            ids = (layer * H + np.arange(H)) * CTX + p
            vectors, values = rng.standard_normal((2, H, D)).astype(np.float32)
            store.upsert(name, ids, vectors, tags(ids), payload=values)
        times.append(time.perf_counter() - start)
    return times


def per_position(backend: str, positions: int) -> None:
    root = tempfile.mkdtemp()
    store = get_store(backend, path=root)
    empty = disk(root)
    times = decode(store, "text-m", positions)
    written = (disk(root) - empty) / positions
    if hasattr(store, "compact"):
        store.compact("text-m")
    print(
        f"{backend}: {(disk(root) - empty) / positions:,.0f} bytes/position on disk ({written:,.0f} as written); "
        f"a decode step's 12 upserts: median {np.median(times) * 1e3:.1f} ms"
    )


def whole_text(backend: str) -> None:
    root, n = tempfile.mkdtemp(), L * H * CTX
    store, ids = get_store(backend, path=root), np.arange(n)
    vectors, values = rng.standard_normal((2, n, D)).astype(np.float32)
    store.create("text-big", D, "l2", ATTRS, payload=W)
    for s in range(0, n, 4096):
        part = slice(s, s + 4096)
        store.upsert("text-big", ids[part], vectors[part], tags(ids[part]), payload=values[part])
    store.flush()
    fresh = get_store(backend, path=root)
    for what in ("fresh connection", "again"):
        start = time.perf_counter()
        got, got_values = fresh.fetch("text-big", ids[::-1], payload=True)
        print(f"{backend}: fetch of {n:,} ids with payload, {what}: {time.perf_counter() - start:.2f} s")
        assert np.array_equal(got, vectors[::-1]) and np.array_equal(got_values, values[::-1])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("backends", nargs="*", default=["memory", "faiss", "lancedb"])
    parser.add_argument("--positions", type=int, default=64)
    args = parser.parse_args()
    for backend in args.backends:
        per_position(backend, args.positions)
        whole_text(backend)
